"""Bring your own dataset: TRL, EasyR1 and ms-swift layouts as those trainers' users have them,
in every container `datasets` writes (save_to_disk, parquet, shards, `PATH@SPLIT`), with media
in the dataset itself, read through the vision adapter, and big splits served lazily."""
from __future__ import annotations

import io
import json
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from PIL import Image

import mmrlvr.data.sources as sources_mod
from mmrlvr.config import DataConfig
from mmrlvr.data import DataError, LazySplit, LoadReport, load_dataset, load_split

pytestmark = pytest.mark.filterwarnings("ignore::mmrlvr.data.DataWarning")


def _png(side: int = 8, color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), color).save(buf, format="PNG")
    return buf.getvalue()


def _trl_rows(n: int = 3) -> dict[str, list]:
    """TRL's vision GRPO layout: conversational `prompt`, a PIL `image`, `solution`."""
    return {
        "prompt": [[{"role": "system", "content": [{"type": "text", "text": "Think first."}]},
                    {"role": "user", "content": [{"type": "image"},
                                                 {"type": "text", "text": f"How many? ({i})"}]}]
                   for i in range(n)],
        "image": [Image.new("RGB", (8 + i, 8), (i * 40, 0, 0)) for i in range(n)],
        "solution": [f"${i}$" for i in range(n)],
        "difficulty": list(range(n)),
    }


def _check_trl(examples) -> None:
    assert [ex.prompt for ex in examples] == ["How many? (0)", "How many? (1)", "How many? (2)"]
    assert [ex.answer for ex in examples] == ["$0$", "$1$", "$2$"]
    assert [ex.images[0].size for ex in examples] == [(8, 8), (9, 8), (10, 8)]
    assert examples[2].images[0].getpixel((0, 0)) == (80, 0, 0)     # the row's own image
    assert examples[1].meta == {"solution": "$1$", "difficulty": 1, "system": "Think first."}


def test_trl_conversational_dataset_saved_to_disk_and_as_parquet(tmp_path):
    ds = datasets.Dataset.from_dict(_trl_rows())
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "trl.parquet"))
    _check_trl(load_dataset(tmp_path / "saved"))
    _check_trl(load_dataset(tmp_path / "trl.parquet"))


def test_easyr1_geometry3k_parquet_needs_no_layout_prefix(tmp_path):
    pq.write_table(pa.table({
        "images": [[{"bytes": _png(56), "path": "a.png"}],
                   [{"bytes": _png(8), "path": "b.png"}, {"bytes": _png(9), "path": "c.png"}]],
        "problem": ["<image>Find x. Round to the nearest tenth.", "<image>\n<image> Compare."],
        "answer": ["12.5", "48"]}), tmp_path / "train.parquet")
    a, b = load_dataset(tmp_path / "train.parquet")
    assert (a.prompt, a.answer, b.prompt) == ("Find x. Round to the nearest tenth.", "12.5", "Compare.")
    assert [im.size for im in b.images] == [(8, 8), (9, 9)]           # in memory, in order
    assert a.id == "train-1" and a.meta == {}
    assert not (tmp_path / ".train_media").exists()                    # no files written

    pq.write_table(pa.table({"images": [[{"bytes": _png(), "path": None}]],
                             "problem": ["<image><image> Two figures?"], "answer": ["1"]}),
                   tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad\.parquet, row 1 .*2 image placeholder\(s\).*for 1 image"):
        load_dataset(tmp_path / "bad.parquet")


def test_ms_swift_jsonl_with_messages_images_and_extra_columns(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    Image.new("RGB", (9, 9)).save(tmp_path / "b.png")
    t = np.arange(800) / 8000
    sf.write(str(tmp_path / "c.wav"), (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 8000)
    rows = [
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "<image>How many objects?"},
                      {"role": "assistant", "content": "<think>I count three.</think><answer>3</answer>"}],
         "images": ["a.png"], "difficulty": "easy"},
        {"messages": [{"role": "user", "content": "<image><image>Which is bigger?"}],
         "images": ["a.png", "b.png"], "solution": "<answer> B </answer>", "difficulty": "hard"},
        {"messages": [{"role": "user", "content": "<audio>Is it a tone?"},
                      {"role": "assistant", "content": "yes"}], "audios": ["c.wav"]},
    ]
    (tmp_path / "swift.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b, c = load_dataset(tmp_path / "swift.jsonl")
    assert (a.prompt, a.answer, a.reasoning) == ("How many objects?", "3", "I count three.")
    assert a.images == [str(tmp_path / "a.png")]
    assert a.meta == {"difficulty": "easy", "system": "Be brief."}
    assert (b.prompt, b.answer) == ("Which is bigger?", "B")
    assert b.images == [str(tmp_path / "a.png"), str(tmp_path / "b.png")]
    assert b.meta == {"solution": "<answer> B </answer>", "difficulty": "hard"}
    assert (c.prompt, c.answer, c.audios) == ("Is it a tone?", "yes", [str(tmp_path / "c.wav")])


def test_path_at_split_reads_dataset_dicts_split_dirs_and_hub_snapshots(tmp_path):
    rows = {"problem": ["a?", "b?", "c?"], "answer": ["1", "2", "3"]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                          "test": datasets.Dataset.from_dict({k: v[:1] for k, v in rows.items()})}
                         ).save_to_disk(str(tmp_path / "dd"))
    assert [ex.prompt for ex in load_dataset(f"{tmp_path / 'dd'}@train")] == ["a?", "b?", "c?"]
    assert [ex.answer for ex in load_dataset(f"{tmp_path / 'dd'}@test")] == ["1"]
    with pytest.raises(DataError, match=r"splits \['train', 'test'\]; name one"):
        load_dataset(tmp_path / "dd")
    with pytest.raises(DataError, match="no split 'dev'"):
        load_dataset(f"{tmp_path / 'dd'}@dev")

    (tmp_path / "split_dirs" / "train").mkdir(parents=True)        # a dir per split
    pq.write_table(pa.table(rows), tmp_path / "split_dirs" / "train" / "part-0.parquet")
    assert len(load_dataset(f"{tmp_path / 'split_dirs'}@train")) == 3
    (tmp_path / "split_dirs" / "test.jsonl").write_text(json.dumps({"problem": "d?", "answer": 4}))
    assert load_dataset(f"{tmp_path / 'split_dirs'}@test")[0].answer == "4"     # a file per split

    (tmp_path / "snap" / "data").mkdir(parents=True)                 # a hub snapshot
    for split in ("train", "test"):
        pq.write_table(pa.table(rows), tmp_path / "snap" / "data" / f"{split}-00000-of-00001.parquet")
    assert len(load_dataset(f"{tmp_path / 'snap'}@test")) == 3
    with pytest.raises(DataError, match=r"splits \['test', 'train'\]; name one"):
        load_dataset(tmp_path / "snap")


def test_parquet_shard_dir_names_the_shard_and_row_of_a_bad_row(tmp_path):
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.table({"question": ["a", "b"], "answer": ["1", "2"]}),
                   tmp_path / "shards" / "part-0.parquet")
    pq.write_table(pa.table({"question": ["c", "d"], "answer": ["3", ""]}),
                   tmp_path / "shards" / "part-1.parquet")
    with pytest.raises(DataError) as err:
        load_dataset(tmp_path / "shards")
    assert f"{tmp_path / 'shards' / 'part-1.parquet'}, row 2 (id part-1-2)" in str(err.value)
    report = LoadReport()
    kept = load_dataset(tmp_path / "shards", on_error="skip", report=report)
    assert [ex.prompt for ex in kept] == ["a", "b", "c"]
    assert [(Path(s.file).name, s.row) for s in report.skipped] == [("part-1.parquet", 2)]


@pytest.mark.parametrize("prompt, fragment", [
    (["What is 2+2?", "Answer briefly."], "'prompt' is a list but not chat messages"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
      {"role": "user", "content": "c"}], "more than one user turn"),
    ([{"role": "user", "content": [{"type": "document"}]}], "unsupported content part"),
    ("Count the <|image_pad|> here", "model token '<|image_pad|>'"),
])
def test_prompts_that_cannot_be_read_are_errors_naming_the_row(tmp_path, prompt, fragment):
    rows = [{"prompt": "fine", "solution": "1"}, {"prompt": prompt, "solution": "2"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as err:
        load_dataset(tmp_path / "d.jsonl")
    assert f"{tmp_path / 'd.jsonl'}, row 2 (id d-2)" in str(err.value) and fragment in str(err.value)
    assert "[" not in load_dataset(tmp_path / "d.jsonl", on_error="skip")[0].prompt


def test_in_memory_media_is_checked_for_size_and_decoding(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def png(side: int) -> bytes:
        buf = io.BytesIO()
        Image.new("1", (side, side)).save(buf, format="PNG")
        return buf.getvalue()

    noise = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 30, 3), dtype=np.uint8)).save(
        noise, format="PNG")
    truncated = noise.getvalue()[: len(noise.getvalue()) * 6 // 10]

    def clip(seconds: int) -> dict:
        return {"array": [0.1] * (seconds * 100), "sampling_rate": 100}

    images = [png(10), png(50), png(10), truncated, b"not an image"]
    pq.write_table(pa.table({
        "prompt": [f"p{i}" for i in range(5)], "answer": ["a"] * 5,
        "image": [{"bytes": b, "path": None} for b in images],
        "audio": [clip(1), clip(1), clip(9), clip(1), clip(1)]}), tmp_path / "m.parquet")
    report = LoadReport()
    kept = load_dataset(tmp_path / "m.parquet", on_error="skip", report=report,
                        max_image_pixels=1000, max_audio_seconds=5)
    assert [ex.prompt for ex in kept] == ["p0"]
    assert isinstance(kept[0].images[0], Image.Image) and kept[0].audios[0][1] == 100
    assert [s.row for s in report.skipped] == [2, 3, 4, 5]
    reasons = [s.reason for s in report.skipped]
    assert "in-memory image is 50×50 = 0.0025 MP, over data.max_image_pixels = 0.001 MP" in reasons[0]
    assert "lasts 9.0 s" in reasons[1]
    assert "in-memory image cannot be decoded" in reasons[2]
    assert "image 0 in 'image' cannot be decoded" in reasons[3]


def test_data_columns_map_any_names_and_check_them(tmp_path):
    pq.write_table(pa.table({"q": ["2+2?"], "gold": [4], "pic": [{"bytes": _png(), "path": None}],
                             "note": ["x"]}), tmp_path / "d.parquet")
    [ex] = load_dataset(tmp_path / "d.parquet", columns={"prompt": "q", "answer": "gold",
                                                         "images": "pic"})
    assert (ex.prompt, ex.answer, ex.images[0].size, ex.meta) == ("2+2?", "4", (8, 8),
                                                                  {"gold": 4, "note": "x"})
    cfg = DataConfig(train=str(tmp_path / "d.parquet"), columns={"prompt": "q", "answer": "gold"})
    assert load_split(cfg, "train")[0].answer == "4"
    with pytest.raises(DataError, match="maps answer to column 'label', which the dataset lacks"):
        load_dataset(tmp_path / "d.parquet", columns={"prompt": "q", "answer": "label"})
    with pytest.raises(DataError, match="unknown field 'promt'"):
        load_dataset(tmp_path / "d.parquet", columns={"promt": "q"})
    with pytest.raises(DataError, match=r"cannot tell which column holds the prompt.*data\.columns"):
        load_dataset(tmp_path / "d.parquet")


def test_class_labels_json_arrays_and_audio_in_the_dataset(tmp_path):
    wav = io.BytesIO()
    sf.write(wav, np.full(1600, 0.2, dtype=np.float32), 16000, format="WAV")
    features = datasets.Features({"question": datasets.Value("string"),
                                  "answer": datasets.ClassLabel(names=["no", "yes"]),
                                  "audio": {"bytes": datasets.Value("binary"),
                                            "path": datasets.Value("string")}})
    datasets.Dataset.from_dict({"question": ["Tone?"], "answer": [1],
                                "audio": [{"bytes": wav.getvalue(), "path": None}]},
                               features=features).to_parquet(str(tmp_path / "a.parquet"))
    [ex] = load_dataset(tmp_path / "a.parquet")
    assert ex.answer == "yes" and ex.audios[0][1] == 16000 and len(ex.audios[0][0]) == 1600
    (tmp_path / "d.json").write_text(json.dumps([{"problem": "x?", "answer": "1",
                                                  "audios": [{"array": [0.1] * 100,
                                                              "sampling_rate": 100}]}]))
    [ex] = load_dataset(tmp_path / "d.json")
    assert ex.audios[0][1] == 100 and ex.audios[0][0].dtype == np.float32


def test_hub_ids_are_refused_with_how_to_download(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"not found: hiyouga/geometry3k .*download it first.*"
                                        r"data/geometry3k@train"):
        load_dataset("hiyouga/geometry3k@train")


def test_in_memory_image_bytes_reach_the_vision_adapter(tmp_path, tiny_vl):
    from transformers import AutoProcessor

    import modalities

    pq.write_table(pa.table({
        "problem": ["<image>Small?", "<image>Big?"], "answer": ["1", "2"],
        "images": [[{"bytes": _png(56), "path": None}], [{"bytes": _png(112), "path": None}]]}),
        tmp_path / "d.parquet")
    examples = load_dataset(tmp_path / "d.parquet")
    processor = AutoProcessor.from_pretrained(tiny_vl)
    batch = modalities.get("vision").encode(examples, processor)
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (batch.inputs["input_ids"] == pad).sum(dim=1).tolist() == [4, 16]   # 56 px, 112 px
    assert batch.inputs["image_grid_thw"].tolist() == [[1, 4, 4], [1, 8, 8]]
    assert "<image>" not in batch.prompt_texts[0] and "Small?" in batch.prompt_texts[0]


def _big(tmp_path: Path, n: int, bad: dict[int, str] | None = None) -> Path:
    bad = bad or {}
    images = [[{"bytes": b"broken" if bad.get(i) == "image" else _png(8, (i % 256, 0, 0)),
                "path": None}] for i in range(n)]
    answers = ["" if bad.get(i) == "answer" else str(i) for i in range(n)]
    pq.write_table(pa.table({"problem": [f"<image>q{i}" for i in range(n)], "answer": answers,
                             "images": images}), tmp_path / "big.parquet", row_group_size=100)
    return tmp_path / "big.parquet"


def test_a_big_split_is_served_lazily_by_position(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(sources_mod, "LAZY_BYTES", 10_000)            # this file is "big"
    path = _big(tmp_path, 600, bad={5: "answer"})
    report = LoadReport()
    split = load_split(DataConfig(train=str(path), on_error="skip"), "train", report)
    assert isinstance(split, LazySplit) and len(split) == 599 and report.kept == 599
    assert [s.row for s in report.skipped] == [6]                      # the text scan saw row 6
    assert [split[i].prompt for i in (0, 5, 598, -1)] == ["q0", "q6", "q599", "q599"]
    assert split[300].images[0].getpixel((0, 0)) == (301 % 256, 0, 0)
    assert split[300].id == "big-302" and split[300] is not split[300]  # built per access
    assert [ex.answer for ex in split[10:13]] == ["11", "12", "13"]
    with pytest.raises(IndexError):
        split[599]
    eager = load_dataset(path, on_error="skip", lazy=False)
    assert isinstance(eager, list) and [ex.prompt for ex in eager] == [split[i].prompt
                                                                         for i in range(599)]


def test_a_lazy_split_checks_media_of_a_sample_then_each_row_as_drawn(tmp_path, monkeypatch):
    from mmrlvr.data.lazy import sample_positions

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    assert 0 in sample_positions(600) and 3 not in sample_positions(600)
    path = _big(tmp_path, 600, bad={0: "image"})                       # row 1: in the sample
    with pytest.raises(DataError, match=r"big\.parquet, row 1 .*cannot be decoded"):
        load_dataset(path, lazy=True)
    report = LoadReport()
    assert len(load_dataset(path, lazy=True, on_error="skip", report=report)) == 599
    assert [s.row for s in report.skipped] == [1]

    path = _big(tmp_path, 600, bad={3: "image"})                       # row 4: not sampled
    split = load_dataset(path, lazy=True)
    assert len(split) == 600 and split[2].prompt == "q2"
    with pytest.raises(DataError, match=r"row 4 .*cannot be decoded.*found when the row was drawn"):
        split[3]
    report = LoadReport()
    split = load_dataset(path, lazy=True, on_error="skip", report=report)
    with pytest.warns(match=r"took the next one: .*row 4 "):
        assert split[3].prompt == "q4"
    assert [s.row for s in report.skipped] == [4]
