"""Shapes out of distribution: a third split, `test_ood.jsonl`, of the same seven question
families drawn from a shifted distribution, and the `mmrlvr data shapes` entry that writes it
(`--ood`).

Why: NC-GRPO (latent-noise rollout branching, docs/methods.md) claims its gains show out of domain;
on the CPU shapes task the in-distribution test split alone cannot show that. The shifts are our
choice (the paper evaluates on other benchmarks, not on a shifted synthetic split):

    count        6-7 shapes                     (train/test: 1-5)
    count_color  5-6 shapes of the asked colour (train/test: 1-4), up to 7 shapes in all
    arith        plus answers 6-7, minus 4-5    (train/test: plus 2-5, minus 0-3), up to 7 shapes
    yesno        5-7 shapes of clutter          (train/test: 1-4)
    color, kind  a lone shape at 0.15-0.25 of the image side (train/test: 0.35-0.6) on a
                 background no train/test image has ("slate", light blue-gray)
    position     two shapes at 0.12-0.2 of the side (train/test: 0.25-0.4), on "slate"

Questions, answer words and the prompt wording are the training ones; answers are balanced over
each family's OOD answer cells as `make_shapes` balances the test split. The split draws from its
own seed (`shapes-ood-SEED`) after train and test are written, so `train.jsonl` and
`test.jsonl` are byte for byte those of the same call without `--ood`; `info.json` gains the
OOD counts and file. Images are `images/ood-NNNNNN.png`, ids `ood-NNNNNN`.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from mmrlvr.data import write_jsonl
from mmrlvr.tasks import Task
from mmrlvr.tasks.shapes import (
    ANSWER_CELLS,
    SHIFTED_BACKGROUNDS,
    Dist,
    _split,
    _weights,
    make_shapes,
)

OOD_CELLS: dict[str, list] = {
    **ANSWER_CELLS,
    "count": [6, 7],
    "count_color": [5, 6],
    "arith": [("plus", 6), ("plus", 7), ("minus", 4), ("minus", 5)],
}
"""Each family's answer cells in the OOD split (color, kind, position, yesno: the training
answers; their scenes shift instead)."""

OOD = Dist(cells=OOD_CELLS, most=7, yesno_shapes=(5, 7), single_scale=(0.15, 0.25),
           pair_scale=(0.12, 0.2), lone_backgrounds=tuple(SHIFTED_BACKGROUNDS))
"""The shifted distribution (the table in the module docstring)."""


def make_ood(out_dir: str | Path, *, n: int = 200, seed: int = 0, image_size: int = 112,
             families: list[str] | None = None, mix: dict[str, float] | None = None) -> dict:
    """Write `images/ood-*.png` and `test_ood.jsonl` into `out_dir`; returns the per-family
    counts. Needs no train split: the shifted cells never produce a train scene."""
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    examples, counts = _split(out_dir, "ood", n, random.Random(f"shapes-ood-{seed}"),
                              _weights(families, mix), image_size, set(), set(), OOD)
    for ex in examples:
        ex.meta["shift"] = "ood"
    write_jsonl(examples, out_dir / "test_ood.jsonl")
    return counts


def make_shapes_with_ood(out_dir: str | Path, *, ood: bool = False, n_ood: int | None = None,
                         **options) -> dict:
    """`make_shapes(out_dir, **options)`, then with `ood` the OOD split (`n_ood` rows, default
    `n_test`), recorded in `info.json`."""
    info = make_shapes(out_dir, **options)
    if not ood:
        return info
    n = info["n_test"] if n_ood is None else n_ood
    if n < 1:
        raise ValueError(f"shapes --ood: the OOD split needs at least one row, got {n} "
                         "(it has as many as the test split: raise --n-test)")
    info["counts"]["ood"] = make_ood(out_dir, n=n, seed=info["seed"],
                                     image_size=info["image_size"], families=info["families"],
                                     mix=info["mix"])
    info["n_ood"] = n
    info["files"]["ood"] = "test_ood.jsonl"
    info["ood_shift"] = ("count 6-7, count_color 5-6, arith plus 6-7 / minus 4-5, yesno 5-7 "
                         "shapes; color/kind/position: small shapes on an unseen background")
    (Path(out_dir) / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


TASK = Task(
    "counting, colour and kind questions about drawn shapes (vision); --ood adds test_ood.jsonl",
    lambda out, o: make_shapes_with_ood(out, ood=o.ood, n_train=o.n_train, n_test=o.n_test,
                                        seed=o.seed, image_size=o.image_size,
                                        families=o.families))
