"""The synthetic shapes dataset: deterministic, balanced, loadable, and true to its images."""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from mmrlvr.data import load_jsonl
from mmrlvr.tasks.shapes import (ANSWER_CELLS, COLORS, FAMILIES, KINDS, make_example, make_shapes,
                               reference_completion)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    info = make_shapes(out, n_train=140, n_test=35, seed=3, image_size=56)
    return out, info


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_deterministic_and_seed_sensitive(tmp_path, dataset):
    out, _ = dataset
    again = tmp_path / "again"
    make_shapes(again, n_train=140, n_test=35, seed=3, image_size=56)
    assert _files(out) == _files(again)
    other = tmp_path / "other"
    make_shapes(other, n_train=140, n_test=35, seed=4, image_size=56)
    assert (other / "train.jsonl").read_bytes() != (out / "train.jsonl").read_bytes()


def test_rows_load_back_with_images_of_the_right_size(dataset):
    out, info = dataset
    for split, n in (("train", 140), ("test", 35)):
        rows = load_jsonl(out / f"{split}.jsonl")
        assert len(rows) == n
        assert [r.id for r in rows] == [f"{split}-{i:06d}" for i in range(n)]
        raw = [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]
        assert all(not Path(r["images"][0]).is_absolute() for r in raw)
        for r in rows:
            assert len(r.images) == 1 and Path(r.images[0]).is_file()
            assert r.answer and r.answer == r.answer.lower() and r.reasoning and r.steps
            assert "<image>" not in r.prompt
            assert r.meta["family"] in FAMILIES
        assert Counter(r.meta["family"] for r in rows) == Counter(info["counts"][split])
        with Image.open(rows[0].images[0]) as img:
            assert img.size == (56, 56) and img.mode == "RGB"
    assert info == json.loads((out / "info.json").read_text())
    assert info["counts"]["train"] == {f: 20 for f in FAMILIES}  # uniform mix, exact split
    assert info["image_size"] == 56 and info["seed"] == 3


def test_train_and_test_are_disjoint(dataset):
    out, _ = dataset

    def keys(split):
        return {(r.meta["family"], Path(r.images[0]).read_bytes(), r.prompt)
                for r in load_jsonl(out / f"{split}.jsonl")}

    assert not keys("train") & keys("test")


def _check_truth(family: str, ex) -> None:
    m, shapes = ex.meta, ex.meta["shapes"]
    kinds = Counter(s["kind"] for s in shapes)
    colors = Counter(s["color"] for s in shapes)
    if family == "count":
        assert ex.answer == str(len(shapes)) == str(m["count"])
    elif family == "color":
        assert len(shapes) == 1 and ex.answer == shapes[0]["color"]
    elif family == "kind":
        assert len(shapes) == 1 and ex.answer == shapes[0]["kind"]
    elif family == "position":
        t = m["target"]
        (target,) = [s for s in shapes if s["kind"] == t["kind"] and s["color"] == t["color"]]
        (other,) = [s for s in shapes if s is not target]
        assert other["kind"] != target["kind"] and other["color"] != target["color"]
        assert ex.answer == ("left" if target["x"] < other["x"] else "right")
    elif family == "count_color":
        assert len(colors) == 2 and ex.answer == str(colors[m["color"]])
    elif family == "arith":
        a, b = (kinds[k] for k in m["kinds"])
        assert len(kinds) == 2 and a >= 1 and b >= 1
        assert ex.answer == str(a + b if m["op"] == "plus" else a - b)
    elif family == "yesno":
        t = m["target"]
        has = any(s["kind"] == t["kind"] and s["color"] == t["color"] for s in shapes)
        assert ex.answer == ("yes" if has else "no")
    for s in shapes:
        assert s["kind"] in KINDS and s["color"] in COLORS


def test_ground_truth_matches_meta_and_pixels(dataset):
    out, _ = dataset
    rows = load_jsonl(out / "train.jsonl") + load_jsonl(out / "test.jsonl")
    for ex in rows:
        _check_truth(ex.meta["family"], ex)
    for ex in rows[:40]:
        with Image.open(ex.images[0]) as img:
            img = img.convert("RGB")
            for s in ex.meta["shapes"]:
                assert img.getpixel((s["x"], s["y"])) == COLORS[s["color"]], (ex.id, s)
            # nothing but the background and the recorded colours is drawn
            used = {c for _, c in img.getcolors(maxcolors=64)}
            assert len(used) <= 1 + len({s["color"] for s in ex.meta["shapes"]})


def test_shapes_do_not_overlap_and_stay_inside():
    rng = random.Random(0)
    for size in (56, 112):
        for family, gen in FAMILIES.items():
            for _ in range(30):
                boxes = []
                for s in gen(rng, size).shapes:
                    x0, y0 = s.x - s.size // 2, s.y - s.size // 2
                    box = (x0, y0, x0 + s.size - 1, y0 + s.size - 1)
                    assert 0 <= box[0] and 0 <= box[1] and box[2] < size and box[3] < size
                    assert s.size >= size // 6, (family, s)  # large enough to read
                    for b in boxes:
                        assert box[2] < b[0] or b[2] < box[0] or box[3] < b[1] or b[3] < box[1]
                    boxes.append(box)


def test_answers_balanced_within_each_family():
    expected = {
        "count": {"1", "2", "3", "4", "5"},
        "color": set(COLORS),
        "kind": set(KINDS),
        "position": {"left", "right"},
        "count_color": {"1", "2", "3", "4"},
        "yesno": {"yes", "no"},
    }
    n = 600
    for family, answers in expected.items():
        rng = random.Random(family)
        got = Counter(FAMILIES[family](rng, 112).answer for _ in range(n))
        assert set(got) == answers, family
        share = n / len(answers)
        assert all(abs(c - share) < 0.25 * share for c in got.values()), (family, got)
    rng = random.Random("arith")
    got = [FAMILIES["arith"](rng, 112) for _ in range(n)]
    ops = Counter(s.meta["op"] for s in got)
    assert abs(ops["plus"] - n / 2) < 0.1 * n
    for op, answers in (("plus", {"2", "3", "4", "5"}), ("minus", {"0", "1", "2", "3"})):
        c = Counter(s.answer for s in got if s.meta["op"] == op)
        assert set(c) == answers
        share = ops[op] / len(answers)
        assert all(abs(v - share) < 0.3 * share for v in c.values()), (op, c)


def test_splits_deal_answers_exactly_evenly(dataset):
    out, _ = dataset
    for split in ("train", "test"):
        by_family: dict[str, Counter] = {}
        for r in load_jsonl(out / f"{split}.jsonl"):
            cell = (r.meta["op"], r.answer) if r.meta["family"] == "arith" else r.answer
            by_family.setdefault(r.meta["family"], Counter())[cell] += 1
        for family, got in by_family.items():
            cells = len(ANSWER_CELLS[family])
            n = sum(got.values())
            assert len(got) == min(cells, n), (split, family, got)
            assert max(got.values()) - min(got.values()) <= 1, (split, family, got)


def test_pick_fixes_the_answer():
    rng = random.Random(5)
    for family, cells in ANSWER_CELLS.items():
        answers = [FAMILIES[family](rng, 56, pick).answer for pick in range(len(cells))]
        assert len(set(answers)) == len(answers) or family == "arith", (family, answers)
        assert answers == [FAMILIES[family](rng, 56, pick).answer for pick in range(len(cells))]


def test_make_example_and_reference_completion(tmp_path):
    ex = make_example("count", random.Random(1), tmp_path / "img" / "x-000001.png", 112)
    assert ex.id == "x-000001" and Path(ex.images[0]).is_file()
    assert ex.meta["family"] == "count"
    text = reference_completion(ex)
    assert text == f"<think>{ex.reasoning}</think><answer>{ex.answer}</answer>"
    with Image.open(ex.images[0]) as img:
        assert img.size == (112, 112)


def test_mix_and_family_selection(tmp_path):
    info = make_shapes(tmp_path / "a", n_train=10, n_test=3, families=["count", "yesno"],
                       mix={"count": 4, "yesno": 1}, image_size=56)
    assert info["counts"]["train"] == {"count": 8, "yesno": 2}
    assert sum(info["counts"]["test"].values()) == 3
    info = make_shapes(tmp_path / "b", n_train=4, n_test=0, families=["kind"], image_size=56)
    assert info["counts"]["train"] == {"kind": 4}
    assert {r.meta["family"] for r in load_jsonl(tmp_path / "b" / "train.jsonl")} == {"kind"}
    with pytest.raises(ValueError, match="unknown shapes families"):
        make_shapes(tmp_path / "c", families=["nope"])
    with pytest.raises(ValueError, match="mix"):
        make_shapes(tmp_path / "c", families=["count"], mix={"count": 1, "kind": 1})


def test_ood_split_leaves_train_and_test_bytes_and_shifts_each_family(tmp_path):
    from mmrlvr.tasks import TASKS, TaskOptions
    from mmrlvr.tasks.shapes_ood import OOD_CELLS

    plain, ood = tmp_path / "plain", tmp_path / "ood"
    opts = {"n_train": 35, "n_test": 28, "seed": 2, "image_size": 56}
    TASKS.get("shapes").make(plain, TaskOptions(**opts))
    info = TASKS.get("shapes").make(ood, TaskOptions(**opts, ood=True))
    assert not (plain / "test_ood.jsonl").exists()
    for name in ("train.jsonl", "test.jsonl"):
        assert (plain / name).read_bytes() == (ood / name).read_bytes()
    assert {p.name for p in (plain / "images").iterdir()} == \
        {p.name for p in (ood / "images").iterdir() if not p.name.startswith("ood-")}
    rows = load_jsonl(ood / "test_ood.jsonl")
    assert len(rows) == 28 == info["n_ood"] and info["files"]["ood"] == "test_ood.jsonl"
    assert Counter(r.meta["family"] for r in rows) == Counter(info["counts"]["ood"])
    train = load_jsonl(ood / "train.jsonl")
    for r in rows:
        fam, shapes = r.meta["family"], r.meta["shapes"]
        if fam == "count":
            assert r.answer in ("6", "7") and len(shapes) == int(r.answer)
        elif fam == "count_color":
            assert r.answer in ("5", "6") and sum(s["color"] == r.meta["color"] for s in shapes) == int(r.answer)
        elif fam == "arith":
            assert r.answer in ("4", "5", "6", "7") and len(shapes) <= 7
        elif fam == "yesno":
            assert 5 <= len(shapes) <= 7
        else:                             # color, kind, position: small shapes, unseen background
            assert r.meta["background"] == "slate" and max(s["size"] for s in shapes) <= 0.25 * 56
        with Image.open(r.images[0]) as img:
            assert img.size == (56, 56)
    assert set(OOD_CELLS) == set(FAMILIES)
    assert not {r.meta["background"] for r in train} & {"slate"}
    assert max(int(r.answer) for r in train if r.meta["family"] == "count") <= 5
    again = tmp_path / "again"
    TASKS.get("shapes").make(again, TaskOptions(**opts, ood=True))
    assert (again / "test_ood.jsonl").read_bytes() == (ood / "test_ood.jsonl").read_bytes()
