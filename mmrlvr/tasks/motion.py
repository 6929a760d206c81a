"""Motion: a seeded synthetic video task whose answers need the frames, not one of them.

Each clip is `frames` frames (8 by default) of `size` × `size` px (56: a multiple of 28, so
Qwen2.5-VL needs no resize), the flat backgrounds and solid shapes of `mmrlvr.tasks.shapes`,
written as an H.264 mp4 (`mmrlvr.data.video.write_video`). Three families:

    direction  Which way does the shape move: left, right, up or down?   -> left/right/up/down
    blink      How many times does the shape blink?                      -> "1".."3"
    appear     Shapes appear one by one. What colour is the last to appear? -> red/green/...

A direction clip moves one shape from near one edge to near the opposite one in even steps; a
blink clip holds one shape in place, gone for `answer` separate runs of frames (it is there in
the first and the last frame); an appear clip starts empty and gains three shapes of different
colours, each at its own frame, all kept to the end. No single frame tells a direction or a
count, and every frame but the ones where something appears shows the same scene.

The default `fps` is 2, so that the trainer's default `data.video_fps` (2.0) samples every frame
of an 8-frame clip (4 s; `data.max_frames` 16): a clip sampled sparser could hide a blink. Each
row's `meta` says what the stress operators (`mmrlvr.stress.ops_video`) may do to it:
`reversed_answer` is the gold of the clip played backwards (null: the question means nothing
backwards), `needs_every_frame` that dropping frames can change the answer.

As in `make_shapes`, answers are dealt evenly over each family's cells, each split has its own
seed derived from `seed`, the test split never repeats a train (family, frames, question)
triple, and the same arguments give the same files. `make_motion` writes `videos/*.mp4`,
`train.jsonl`, `test.jsonl` (video paths relative to the file) and `info.json`.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from mmrlvr.data import Example, write_jsonl, write_video
from mmrlvr.tasks import Task
from mmrlvr.tasks.shapes import BACKGROUNDS, COLOR_NAMES, KINDS, Scene, Shape

DIRECTIONS = ("left", "right", "up", "down")
OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}
ANSWER_CELLS: dict[str, list[Any]] = {
    "direction": list(DIRECTIONS),
    "blink": [1, 2, 3],
    "appear": list(COLOR_NAMES),
}
"""Each family's answers, dealt evenly."""
FAMILIES = tuple(ANSWER_CELLS)


@dataclass
class Shot:
    """One generated item: the shapes of every frame and what to ask."""

    frames: list[list[Shape]]
    background: str
    prompt: str
    answer: str
    reasoning: str
    steps: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def render(self, size: int) -> list[Image.Image]:
        return [Scene(shapes, self.background, "", "", "", []).render(size)
                for shapes in self.frames]


def _side(rng: random.Random, size: int, scale: tuple[float, float] = (0.25, 0.35)) -> int:
    return max(6, int(size * rng.uniform(*scale)))


def gen_direction(rng: random.Random, size: int, n_frames: int, cell: str) -> Shot:
    kind, color = rng.choice(KINDS), rng.choice(COLOR_NAMES)
    side = _side(rng, size)
    lo, hi = side // 2 + 1, size - side // 2 - 2          # the centre keeps the shape inside
    across = rng.randint(lo, hi)
    start, end = (hi, lo) if cell in ("left", "up") else (lo, hi)
    path = [round(start + (end - start) * t / (n_frames - 1)) for t in range(n_frames)]
    horizontal = cell in ("left", "right")
    frames = [[Shape(kind, color, p if horizontal else across, across if horizontal else p, side)]
              for p in path]
    ends = ("right", "left") if cell == "left" else ("left", "right") if cell == "right" \
        else ("bottom", "top") if cell == "up" else ("top", "bottom")
    first = f"The {color} {kind} starts at the {ends[0]}."
    last = f"It ends at the {ends[1]}."
    return Shot(frames, rng.choice(list(BACKGROUNDS)),
                "Which way does the shape move: left, right, up or down?", cell,
                f"{first} {last} So it moves {cell}.", [first, last, f"It moves {cell}."],
                {"direction": cell, "answer_set": list(DIRECTIONS), "reversed_answer": OPPOSITE[cell],
                 "needs_every_frame": False})


def _blink_patterns(n_frames: int, blinks: int) -> list[tuple[bool, ...]]:
    """Every on/off pattern of `n_frames` frames, on at both ends, with `blinks` runs of off."""
    out = []
    for inner in itertools.product((True, False), repeat=n_frames - 2):
        pattern = (True, *inner, True)
        runs = sum(1 for a, b in itertools.pairwise(pattern) if a and not b)
        if runs == blinks:
            out.append(pattern)
    return out


def gen_blink(rng: random.Random, size: int, n_frames: int, cell: int) -> Shot:
    kind, color = rng.choice(KINDS), rng.choice(COLOR_NAMES)
    side = _side(rng, size, (0.3, 0.45))
    x = rng.randint(side // 2 + 1, size - side // 2 - 2)
    y = rng.randint(side // 2 + 1, size - side // 2 - 2)
    pattern = rng.choice(_blink_patterns(n_frames, cell))
    frames = [[Shape(kind, color, x, y, side)] if on else [] for on in pattern]
    gone = sum(1 for on in pattern if not on)
    times = "once" if cell == 1 else "twice" if cell == 2 else f"{cell} times"
    runs = "one run" if cell == 1 else f"{cell} separate runs"
    seen = f"The {color} {kind} is gone in {gone} {'frame' if gone == 1 else 'frames'}, in {runs}."
    return Shot(frames, rng.choice(list(BACKGROUNDS)),
                "How many times does the shape blink (vanish and come back)?", str(cell),
                f"{seen} So it blinks {times}.", [seen, f"It blinks {times}."],
                {"blinks": cell, "pattern": [int(on) for on in pattern], "reversed_answer": str(cell),
                 "needs_every_frame": True})


def gen_appear(rng: random.Random, size: int, n_frames: int, cell: str) -> Shot:
    others = rng.sample([c for c in COLOR_NAMES if c != cell], 2)
    colors = [*others, cell]                                # in order of appearance
    at = sorted(rng.sample(range(1, n_frames), 3))          # frame 0 is empty
    third = size // 3
    cells = rng.sample(range(9), 3)
    side = max(6, int(third * 0.8))
    shapes = [Shape(rng.choice(KINDS), c, (k % 3) * third + third // 2 + 1,
                    (k // 3) * third + third // 2 + 1, side) for c, k in zip(colors, cells)]
    frames = [[s for s, t in zip(shapes, at) if t <= f] for f in range(n_frames)]
    steps = [f"The {s.color} {s.kind} appears in frame {t + 1}." for s, t in zip(shapes, at)]
    return Shot(frames, rng.choice(list(BACKGROUNDS)),
                "Shapes appear one by one. What colour is the last shape to appear?", cell,
                " ".join(steps) + f" The last to appear is {cell}.", [*steps, f"The last is {cell}."],
                {"order": colors, "appear_at": at, "answer_set": list(COLOR_NAMES),
                 "reversed_answer": None, "needs_every_frame": True})


GENERATORS = {"direction": gen_direction, "blink": gen_blink, "appear": gen_appear}
"""Family -> generator `(rng, size, n_frames, answer cell) -> Shot`."""


def make_clip(family: str, rng: random.Random, size: int = 56, n_frames: int = 8,
              pick: int | None = None) -> Shot:
    """One `family` item drawn with `rng`; `pick` indexes the family's answer cells (None: a
    uniform draw)."""
    if family not in GENERATORS:
        raise ValueError(f"unknown motion family {family!r}; known: {list(FAMILIES)}")
    cells = ANSWER_CELLS[family]
    cell = cells[pick % len(cells)] if pick is not None else rng.choice(cells)
    return GENERATORS[family](rng, size, n_frames, cell)


def _check(size: int, frames: int, fps: float, families: list[str]) -> None:
    unknown = [f for f in families if f not in GENERATORS]
    if unknown or not families:
        raise ValueError(f"unknown or no motion families {unknown}; known: {list(FAMILIES)}")
    if size < 28 or size % 28:
        raise ValueError(f"motion: size must be a multiple of 28 px (Qwen-VL's patch grid), got "
                         f"{size}")
    need = 7 if "blink" in families else 4 if "appear" in families else 2
    if not need <= frames <= 16 or frames % 2:
        raise ValueError(f"motion: frames must be an even number in [{need}, 16] for the "
                         f"families {families}, got {frames}")
    if not fps > 0:
        raise ValueError(f"motion: fps must be > 0, got {fps}")


def _split(out_dir: Path, split: str, n: int, rng: random.Random, families: list[str],
           size: int, frames: int, fps: float, avoid: set, keys: set
           ) -> tuple[list[Example], dict[str, int]]:
    from tqdm.auto import tqdm

    counts = {f: n // len(families) + (k < n % len(families)) for k, f in enumerate(families)}
    order = []
    for f in families:                       # each family's answers dealt evenly, shuffled
        cells = len(ANSWER_CELLS[f])
        offset = rng.randrange(cells)
        order += [(f, (offset + j) % cells) for j in range(counts[f])]
    rng.shuffle(order)
    examples = []
    for i, (family, pick) in enumerate(tqdm(order, desc=f"motion {split}", unit="clip",
                                            leave=False, disable=True if n < 200 else None)):
        for _ in range(1000):
            clip = make_clip(family, rng, size, frames, pick)
            images = clip.render(size)
            key = (family, hashlib.sha1(b"".join(im.tobytes() for im in images)).hexdigest(),
                   clip.prompt)
            if key not in avoid and key not in keys:
                break
        else:
            raise RuntimeError(f"motion: could not draw a new {split} {family} clip (size "
                               f"{size} and {frames} frames leave too few distinct clips)")
        keys.add(key)
        path = out_dir / "videos" / f"{split}-{i:06d}.mp4"
        write_video(path, images, fps)
        examples.append(Example(id=path.stem, prompt=clip.prompt, answer=clip.answer,
                                videos=[str(path)], reasoning=clip.reasoning, steps=clip.steps,
                                meta={"family": family, **clip.meta, "background": clip.background,
                                      "frames": frames, "fps": fps,
                                      # what `mmrlvr pretrain-vision` teaches the tower to see
                                      "vision_labels": {family: clip.answer}}))
    return examples, counts


def make_motion(out_dir: str | Path, *, n_train: int = 2000, n_test: int = 200, seed: int = 0,
                size: int = 56, frames: int = 8, fps: float = 2.0,
                families: list[str] | None = None) -> dict[str, Any]:
    """Write a motion dataset to `out_dir` and return its info dict (also saved as info.json).

    `families` defaults to all three, split evenly; `frames` is each clip's frame count (even,
    at most 16, at least 7 with `blink`), `fps` its frame rate (see the module docstring)."""
    out_dir = Path(out_dir)
    families = list(dict.fromkeys(families or FAMILIES))
    _check(size, frames, fps, families)
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train}, {n_test}")
    (out_dir / "videos").mkdir(parents=True, exist_ok=True)
    train_keys: set = set()
    shape = (families, size, frames, fps)
    train, train_counts = _split(out_dir, "train", n_train, random.Random(f"motion-train-{seed}"),
                                 *shape, set(), train_keys)
    test, test_counts = _split(out_dir, "test", n_test, random.Random(f"motion-test-{seed}"),
                               *shape, train_keys, set())
    write_jsonl(train, out_dir / "train.jsonl")
    write_jsonl(test, out_dir / "test.jsonl")
    info = {"task": "motion", "seed": seed, "size": size, "frames": frames, "fps": fps,
            "families": families, "n_train": n_train, "n_test": n_test,
            "counts": {"train": train_counts, "test": test_counts},
            "files": {"train": "train.jsonl", "test": "test.jsonl", "videos": "videos"}}
    (out_dir / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


TASK = Task(
    "which way a shape moves, how often it blinks, which colour appears last (video; "
    "--image-size is the frame side, e.g. 56)",
    lambda out, o: make_motion(out, n_train=o.n_train, n_test=o.n_test, seed=o.seed,
                               size=o.image_size, families=o.families))
