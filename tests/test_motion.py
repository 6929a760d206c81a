"""`mmrlvr data motion`: clips that decode, whose frames show what the answer says."""
from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest

from mmrlvr.data import load_jsonl, read_video
from mmrlvr.tasks.motion import ANSWER_CELLS, FAMILIES, make_motion
from mmrlvr.tasks.shapes import BACKGROUNDS, COLORS, reference_completion
from rewards.verify import extract_answer, match


@pytest.fixture(scope="module")
def motion(tmp_path_factory):
    out = tmp_path_factory.mktemp("motion")
    info = make_motion(out, n_train=12, n_test=6, seed=3)
    return out, info, load_jsonl(out / "train.jsonl") + load_jsonl(out / "test.jsonl")


def _mask(frame, background: str) -> np.ndarray:
    """Pixels that are not the background (video coding blurs edges a little: a margin)."""
    a = np.asarray(frame, dtype=np.int32)
    return np.abs(a - np.array(BACKGROUNDS[background])).sum(axis=2) > 90


def _colour_present(frame, colour: str) -> bool:
    a = np.asarray(frame, dtype=np.int32)
    return int((np.abs(a - np.array(COLORS[colour])).sum(axis=2) < 60).sum()) >= 20


def test_make_motion_writes_balanced_loadable_rows(motion):
    out, info, rows = motion
    assert info["counts"] == {"train": {f: 4 for f in FAMILIES}, "test": {f: 2 for f in FAMILIES}}
    assert len({ex.id for ex in rows}) == len(rows) == 18
    line = json.loads((out / "train.jsonl").read_text().splitlines()[0])
    assert line["videos"][0].startswith("videos/train-") and line["videos"][0].endswith(".mp4")
    answers = Counter((ex.meta["family"], ex.answer) for ex in rows[:12])
    for family in FAMILIES:                       # dealt evenly: no answer twice as often
        counts = [answers[(family, str(c))] for c in ANSWER_CELLS[family]]
        assert max(counts) - min(counts) <= 1, (family, counts)
    for ex in rows:                               # the default accuracy reward verifies the gold
        assert match(extract_answer(reference_completion(ex)), ex.answer, ex.choices)


def test_the_frames_show_the_answer(motion):
    _, _, rows = motion
    for ex in rows:
        clip = read_video(ex.videos[0], fps=2.0, max_frames=16)      # the trainer's defaults
        assert clip.indices == list(range(8)) and clip.frames[0].size == (56, 56)
        masks = [_mask(f, ex.meta["background"]) for f in clip.frames]
        family = ex.meta["family"]
        if family == "direction":
            ys, xs = zip(*[np.argwhere(m).mean(axis=0) for m in masks])
            moved = {"left": -np.diff(xs), "right": np.diff(xs), "up": -np.diff(ys),
                     "down": np.diff(ys)}[ex.answer]
            assert (moved > 1).all(), (ex.id, ex.answer, xs, ys)   # every step the gold way
        elif family == "blink":
            on = [int(m.sum() > 30) for m in masks]
            blinks = sum(1 for a, b in itertools.pairwise(on) if a and not b)
            assert on[0] and on[-1] and str(blinks) == ex.answer, (ex.id, on)
        else:
            first = [next(k for k, f in enumerate(clip.frames) if _colour_present(f, c))
                     for c in ex.meta["order"]]
            assert first == sorted(first) and len(set(first)) == 3, (ex.id, first)
            assert ex.meta["order"][-1] == ex.answer and not masks[0].any()


def test_same_arguments_same_rows_and_the_cli_writes_the_task(motion, tmp_path):
    from mmrlvr.cli import main

    out, _, _ = motion
    make_motion(tmp_path / "again", n_train=12, n_test=6, seed=3)
    assert (tmp_path / "again" / "train.jsonl").read_text() == (out / "train.jsonl").read_text()
    assert main(["data", "motion", "--out", str(tmp_path / "cli"), "--n-train", "3",
                 "--n-test", "0", "--image-size", "56", "--families", "direction"]) == 0
    rows = load_jsonl(tmp_path / "cli" / "train.jsonl")
    assert [ex.meta["family"] for ex in rows] == ["direction"] * 3
    with pytest.raises(ValueError, match="multiple of 28"):
        make_motion(tmp_path / "x", n_train=1, n_test=0, size=50)
