"""Datasets: JSONL round trips, errors that name file and row, skip mode, the Geometry3K layout."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from mmrlvr.data import (DataError, DataWarning, Example, LoadReport, load_dataset, load_jsonl,
                         write_jsonl)


def _png(path: Path, size=(8, 6), color=(255, 0, 0)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def _png_bytes(size=(8, 6), color=(0, 0, 255)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _jsonl(path: Path, rows: list) -> Path:
    """Rows are dicts (dumped as JSON) or raw strings (written verbatim, one per line)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = {"id": "g", "prompt": "How many?", "answer": "3"}


# --- Example ----------------------------------------------------------------------------------

def test_example_keyword_construction_needs_only_id_prompt_answer():
    ex = Example(id="x", prompt="What is 2+2?", answer="4")
    assert (ex.id, ex.prompt, ex.answer) == ("x", "What is 2+2?", "4")
    assert ex.images == [] and ex.audios == [] and ex.meta == {}
    assert ex.choices is None and ex.steps is None and ex.reasoning is None
    other = Example(id="y", prompt="p", answer="a")
    ex.images.append("a.png")
    ex.meta["k"] = 1
    assert other.images == [] and other.meta == {}        # defaults are not shared
    with pytest.raises(TypeError):
        Example(id="z", prompt="p")                        # answer is required


def test_example_to_json_drops_empty_fields():
    ex = Example(id="x", prompt="p", answer="a", choices=["1", "2"])
    assert ex.to_json() == {"id": "x", "prompt": "p", "answer": "a", "choices": ["1", "2"]}


# --- JSONL round trip -------------------------------------------------------------------------

def test_jsonl_round_trip_with_relative_image_paths(tmp_path, monkeypatch):
    a = _png(tmp_path / "images" / "a.png")
    b = _png(tmp_path / "images" / "b.png", color=(0, 255, 0))
    examples = [
        Example(id="e1", prompt="Count the shapes.", answer="3", images=[str(a)],
                choices=["2", "3"], steps=["one", "two"], reasoning="r", meta={"family": "count"}),
        Example(id="e2", prompt="Compare.", answer="B", images=[str(a), str(b)]),
        Example(id="e3", prompt="Text only, ünïcode ✓", answer="x"),
    ]
    path = tmp_path / "data.jsonl"
    write_jsonl(examples, path)

    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r.get("images") for r in raw] == [["images/a.png"], ["images/a.png", "images/b.png"], None]
    assert "audios" not in raw[0] and "choices" not in raw[1]

    monkeypatch.chdir(tmp_path.parent)     # paths resolve against the file's dir, not the cwd
    loaded = load_jsonl(path)
    assert loaded == examples
    for ex in loaded:
        for img in ex.images:
            assert Path(img).is_absolute()
            with Image.open(img) as im:
                assert im.size == (8, 6)


def test_hand_written_rows_resolve_relative_images_and_default_ids(tmp_path, monkeypatch):
    _png(tmp_path / "sub" / "img" / "q.png")
    path = _jsonl(tmp_path / "sub" / "train.jsonl",
                  [{"prompt": "What?", "answer": 7, "images": ["img/q.png"]}, "",
                   {"id": 12, "prompt": "Why?", "answer": "because"}])
    monkeypatch.chdir(tmp_path)
    report = LoadReport()
    with pytest.warns(DataWarning, match=r"1 gold answer\(s\) were numbers.*rows 1\)"):
        ex1, ex2 = load_jsonl(path, report=report)
    assert ex1.images == [str(tmp_path / "sub" / "img" / "q.png")]
    assert ex1.id == "train-1"            # no id: file stem and line number
    assert ex1.answer == "7"              # gold answers are strings; a number is converted, counted
    assert report.converted_answers == 1
    assert ex2.id == "12"                 # line 3: the blank line still counts


def test_load_dataset_reads_jsonl_and_fills_report(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [GOOD, {**GOOD, "id": "h"}])
    report = LoadReport()
    assert [ex.id for ex in load_dataset(path, report=report)] == ["g", "h"]
    assert report.kept == 2 and report.skipped == []


# --- errors name the file and the row -------------------------------------------------------

@pytest.mark.parametrize("bad_row, fragment", [
    ({"prompt": "p", "answer": "a", "images": ["missing.png"]}, "image not found"),
    ({"prompt": "p"}, "missing required field 'answer'"),
    ({"prompt": "p", "answer": "  "}, "missing required field 'answer'"),
    ({"prompt": "p", "answer": None}, "missing required field 'answer'"),
    ({"answer": "a"}, "missing required field 'prompt'"),
    ('{"prompt": "p", "answer": ', "invalid JSON"),
    ({"prompt": "p", "answer": "a", "difficulty": 3}, "unknown fields ['difficulty']"),
    ('["p", "a"]', "expected a JSON object"),
    ({"prompt": "p", "answer": "a", "audios": ["nope.wav"]}, "audio not found"),
])
def test_bad_row_error_names_file_and_row(tmp_path, bad_row, fragment):
    path = _jsonl(tmp_path / "d.jsonl", [GOOD, "", bad_row, GOOD])
    with pytest.raises(DataError) as err:
        load_jsonl(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "row 3" in msg                 # line 3: the blank line 2 still counts
    assert fragment in msg


def test_missing_image_error_names_the_resolved_path(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"id": "q7", "prompt": "p", "answer": "a",
                                          "images": ["pics/gone.png"]}])
    with pytest.raises(DataError) as err:
        load_jsonl(path)
    assert str(tmp_path / "pics" / "gone.png") in str(err.value)
    assert "id q7" in str(err.value)


def test_unknown_field_error_points_to_meta(tmp_path):
    # a file of mmrlvr rows is strict: a column it does not know in a later row is a typo
    path = _jsonl(tmp_path / "d.jsonl", [GOOD, {"prompt": "p", "answer": "a", "source": "x"}])
    with pytest.raises(DataError, match="row 2.*under 'meta'"):
        load_jsonl(path)


def test_extra_columns_from_the_first_row_on_are_another_layouts_meta(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "answer": "a", "source": "x"},
                                         {"prompt": "q", "answer": "b", "source": "y"}])
    assert [ex.meta for ex in load_jsonl(path)] == [{"source": "x"}, {"source": "y"}]


def test_empty_dataset_file_raises_through_load_dataset(tmp_path):
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n\n")):
        path = tmp_path / name
        path.write_text(text)
        assert load_jsonl(path) == []
        with pytest.raises(DataError) as err:
            load_dataset(path)
        assert str(path) in str(err.value) and "empty" in str(err.value)


def test_nonexistent_file_raises_naming_it(tmp_path):
    path = tmp_path / "nope.jsonl"
    for load in (load_jsonl, load_dataset):
        with pytest.raises(DataError) as err:
            load(path)
        assert "not found" in str(err.value) and str(path) in str(err.value)
    with pytest.raises(DataError, match="not found"):
        load_dataset(f"geo3k:{tmp_path / 'nope.parquet'}")


@pytest.mark.parametrize("images", [5, [None], "a.png"])
def test_images_that_are_not_a_list_of_paths_raise_data_error(tmp_path, images):
    path = _jsonl(tmp_path / "d.jsonl", [GOOD, {"prompt": "p", "answer": "a", "images": images}])
    with pytest.raises(DataError, match="row 2.*'images' must be a list of strings"):
        load_jsonl(path)


# --- skip mode --------------------------------------------------------------------------------

def test_skip_mode_keeps_good_rows_and_reports_each_bad_one(tmp_path):
    _png(tmp_path / "ok.png")
    rows = [
        {"id": "a", "prompt": "p1", "answer": "1", "images": ["ok.png"]},
        "{not json",                                                    # row 2
        {"id": "b", "prompt": "p2", "answer": "2"},
        {"id": "c", "prompt": "p3"},                                    # row 4: no answer
        {"id": "d", "prompt": "p4", "answer": "4", "images": ["gone.png"]},   # row 5
        {"id": "e", "prompt": "p5", "answer": "5", "extra": 1},         # row 6
        {"id": "f", "prompt": "p6", "answer": "6", "meta": {"k": "v"}},
    ]
    path = _jsonl(tmp_path / "d.jsonl", rows)
    report = LoadReport()
    kept = load_jsonl(path, on_error="skip", report=report)

    assert [ex.id for ex in kept] == ["a", "b", "f"]
    assert kept[0].images == [str(tmp_path / "ok.png")]
    assert kept[2].meta == {"k": "v"}
    assert report.kept == 3
    assert [(s.file, s.row, s.id) for s in report.skipped] == [
        (str(path), 2, None), (str(path), 4, "c"), (str(path), 5, "d"), (str(path), 6, "e")]
    for skipped in report.skipped:
        msg = str(skipped)
        assert msg.startswith(f"{path}, row {skipped.row}") and skipped.reason in msg
    assert "gone.png" in report.skipped[2].reason
    # the same good rows as a clean file would give
    clean = _jsonl(tmp_path / "clean.jsonl", [rows[0], rows[2], rows[6]])
    assert kept == load_jsonl(clean)


def test_skip_mode_where_every_row_is_bad_is_an_empty_dataset(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}, "nope"])
    report = LoadReport()
    with pytest.raises(DataError, match="empty"):
        load_dataset(path, on_error="skip", report=report)
    assert report.kept == 0 and len(report.skipped) == 2


def test_invalid_on_error_value_raises(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [GOOD])
    with pytest.raises(ValueError, match="ignore"):
        load_jsonl(path, on_error="ignore")


# --- Geometry3K parquet layout ----------------------------------------------------------------

def _geo3k_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))),
        ("problem", pa.string()),
        ("answer", pa.string()),
    ])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


GEO_ROWS = [
    {"images": [{"bytes": _png_bytes((8, 6)), "path": "0.png"}],
     "problem": "<image>Find x. Round to the nearest tenth.", "answer": "12.5"},
    {"images": [{"bytes": _png_bytes((10, 4), (0, 255, 0)), "path": "1.png"},
                {"bytes": _png_bytes((4, 10)), "path": "1b.png"}],
     "problem": "<image>\n<image> Find the area of the figure.", "answer": "48"},
    {"images": [], "problem": "Without a figure: 2+2?", "answer": "4"},
]


def test_geo3k_parquet_loads_prompts_answers_and_images(tmp_path):
    path = _geo3k_parquet(tmp_path / "train.parquet", GEO_ROWS)
    examples = load_dataset("geo3k:" + str(path))

    assert [ex.id for ex in examples] == ["geo3k-1", "geo3k-2", "geo3k-3"]
    assert [ex.prompt for ex in examples] == ["Find x. Round to the nearest tenth.",
                                              "Find the area of the figure.",
                                              "Without a figure: 2+2?"]
    assert [ex.answer for ex in examples] == ["12.5", "48", "4"]
    assert all(ex.meta == {"source": "geometry3k"} for ex in examples)
    assert [len(ex.images) for ex in examples] == [1, 2, 0]
    sizes = []
    for img in examples[0].images + examples[1].images:
        assert Path(img).is_file()
        with Image.open(img) as im:
            sizes.append(im.size)
    assert sizes == [(8, 6), (10, 4), (4, 10)]
    # images land beside the dataset; a second load reuses them
    assert Path(examples[1].images[1]).parent == tmp_path / ".train_media"
    assert load_dataset("geo3k:" + str(path)) == examples


def test_geo3k_row_with_empty_answer_raises_naming_the_row(tmp_path):
    rows = GEO_ROWS[:2] + [{"images": [], "problem": "What is y?", "answer": ""}]
    path = _geo3k_parquet(tmp_path / "test.parquet", rows)
    with pytest.raises(DataError) as err:
        load_dataset("geo3k:" + str(path))
    msg = str(err.value)
    assert str(path) in msg and "row 3" in msg and "'answer'" in msg

    report = LoadReport()
    kept = load_dataset("geo3k:" + str(path), on_error="skip", report=report)
    assert [ex.answer for ex in kept] == ["12.5", "48"]
    assert report.kept == 2 and len(report.skipped) == 1 and "row 3" in str(report.skipped[0])
