"""Vision pretraining: the tower alone learns to read banner phrases; the rest is untouched."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from PIL import Image  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from mmrlvr.cli import main  # noqa: E402
from mmrlvr.data import DataError, load_jsonl, write_jsonl  # noqa: E402
from mmrlvr.tiny import build_tiny  # noqa: E402
from mmrlvr.tiny.vision_pretrain import ABSENT, label_space, pretrain_vision, targets  # noqa: E402
from mmrlvr.tasks.banners import make_banners  # noqa: E402

PIXELS = {"min_pixels": 56 * 56, "max_pixels": 112 * 56}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vp")
    make_banners(root / "banners", n_train=2000, n_test=60, width=112, height=56, pairs=["en-de"],
                 compact=True)
    model = build_tiny("qwen2.5-vl", root / "tiny")
    return root, model


def test_banners_label_each_role_with_its_source_text(setup):
    root, _ = setup
    for ex in load_jsonl(root / "banners" / "train.jsonl")[:20]:
        labels = ex.meta["vision_labels"]
        assert list(labels) == ex.meta["roles"]
        assert " | ".join(labels.values()) in ex.reasoning       # the source texts, in box order


def test_label_space_and_targets(setup):
    root, _ = setup
    rows = load_jsonl(root / "banners" / "train.jsonl")
    space = label_space(rows)
    assert set(space) == {"headline", "subline", "tag"} and all(c[0] == ABSENT for c in space.values())
    y = targets(rows, space)
    assert y.shape == (len(rows), 3) and bool((y >= 0).all())
    assert all(y[i, 0] > 0 for i in range(len(rows)))                  # every banner has a headline
    unseen = dataclasses.replace(rows[0], meta={"vision_labels": {"headline": "Zzz"}})
    assert targets([unseen], space)[0].tolist() == [-1, 0, 0]           # unseen label: never right


def test_pretraining_teaches_the_tower_to_read_and_leaves_the_language_model(setup, tmp_path):
    root, model = setup
    out = tmp_path / "read"
    summary = pretrain_vision(model, root / "banners" / "train.jsonl", out,
                              eval_data=root / "banners" / "test.jsonl", steps=400, batch_size=32,
                              lr=1e-3, threads=1, progress=False, **PIXELS)
    # 12 headlines, 24 sublines, 16 tags: near chance before; 400 steps lift every slot well
    # above it (measured: 0.10/0.07/0.05 -> 0.45/0.55/0.53; 5,000 steps on 20,000 banners: 1.0/0.82/0.82)
    start, end = summary["accuracy_start"], summary["accuracy_end"]
    assert start["headline"] < 0.25
    assert all(end[slot] > start[slot] + 0.3 for slot in ("headline", "subline", "tag")), summary
    before, after = load_file(model / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("visual.") or ".visual." in k for k in changed)
    assert any("merger" in k for k in changed)
    assert json.loads((out / "vision_pretrain.json").read_text())["steps"] == 400
    for name in ("tokenizer.json", "chat_template.jinja", "processor_config.json"):
        assert (out / name).is_file(), name


def test_cli_runs_and_reports(setup, tmp_path, capsys):
    root, model = setup
    assert main(["pretrain-vision", "--model", str(model), "--data",
                 str(root / "banners" / "train.jsonl"), "--out", str(tmp_path / "m"), "--steps", "2",
                 "--batch-size", "4", "--min-pixels", "3136", "--max-pixels", "6272"]) == 0
    assert "accuracy_end" in capsys.readouterr().out
    assert (tmp_path / "m" / "model.safetensors").is_file()


def test_bad_rows_are_named(setup, tmp_path):
    root, model = setup
    rows = load_jsonl(root / "banners" / "train.jsonl")[:6]
    rows[3].meta.pop("vision_labels")
    write_jsonl(rows, tmp_path / "no_labels.jsonl", copy_media_to="images")
    with pytest.raises(DataError, match=rows[3].id):
        pretrain_vision(model, tmp_path / "no_labels.jsonl", tmp_path / "x", steps=1, progress=False,
                        **PIXELS)
    rows = load_jsonl(root / "banners" / "train.jsonl")[:4]
    Image.new("RGB", (56, 112), (200, 10, 10)).save(tmp_path / "tall.png")
    rows[2].images = [str(tmp_path / "tall.png")]
    write_jsonl(rows, tmp_path / "sizes.jsonl", copy_media_to="images")
    with pytest.raises(DataError, match=rows[2].id):
        pretrain_vision(model, tmp_path / "sizes.jsonl", tmp_path / "y", steps=1, batch_size=4,
                        progress=False, **PIXELS)


def test_pretraining_on_motion_clips_teaches_the_tower_which_way_a_shape_moves(tmp_path):
    """Video rows: the tower takes each clip as training samples it (8 frames, 4 temporal
    patches) and learns the direction from them, which SFT alone never did (docs/video.md)."""
    from mmrlvr.tasks.motion import make_motion
    from mmrlvr.tiny import build_tiny

    make_motion(tmp_path / "m", n_train=160, n_test=40, seed=0, size=56, families=["direction"])
    model = build_tiny("qwen2.5-vl", tmp_path / "tiny")
    summary = pretrain_vision(model, tmp_path / "m" / "train.jsonl", tmp_path / "seen",
                              eval_data=tmp_path / "m" / "test.jsonl", steps=80, batch_size=16,
                              lr=1e-3, threads=1, progress=False, min_pixels=3136,
                              max_pixels=3136, max_frames=8)
    start, end = summary["accuracy_start"]["direction"], summary["accuracy_end"]["direction"]
    assert start < 0.5 and end > start + 0.3, summary
