"""Zoom: shapes too small to count at the prompt's resolution, and a `zoom` call that shows them
(docs/tools.md, "The zoom task").

Each image is stored at `ZOOM_FACTOR` x the side the prompt shows (`--image-size`, the model's
`max_pixels` side: 112 px by default, so 448 px on disk), as 4 x 4 boxes of 112 px. A question
names one box by its pixels; the box holds tiny shapes (circle, square, triangle; red, green,
blue, yellow) in the cells of a 4 x 4 grid: a shape is 12-24 px on disk, 3-6 px in the prompt's
4x downscaled view, where the whole box is 28 px (one merged token of 2 x 2 patches of 14 px),
so a shape is below one patch and up to four share a patch; their sizes and kinds vary by 4x in
area, so the colour mass a patch holds does not tell their number. `zoom` of the box (112 x 112
px on disk) is re-encoded by the family at its pixel bounds: 112 px, 4x the prompt's view, every
shape 12-24 px. Two families:

    count   How many shapes are in the 112 x 112 px box at x=224, y=112?   -> "1".."4"
    color   What colour is the shape in the 112 x 112 px box at x=0, y=336? -> red/green/blue/yellow

Six other boxes hold distractors (1-4 shapes each for `count`; one shape of another colour each
for `color`), so a count or colour of the whole image does not answer. Every row carries its gold
trajectory (`meta.trajectory`: the zoom call of the named box, then the answer), which
`mmrlvr sft` trains on when the config has `rollout.tools` (`mmrlvr.train.sft_tools`), and the
evidence the crop must show (`meta.evidence`: the box's shapes, in crop pixels). Answers are
dealt evenly over their cells, as in `shapes`; the same arguments give byte-identical files.
`vision.jsonl` / `vision_test.jsonl` are rows for `mmrlvr pretrain-vision` (`vision_rows`).
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from mmrlvr.core.trajectory import format_call
from mmrlvr.data import Example, write_jsonl
from mmrlvr.tasks import Task
from mmrlvr.tasks.shapes import COLOR_NAMES, COLORS, KINDS, Shape, plural

ZOOM_FACTOR = 4
"""Stored side / the prompt's side: the prompt sees the image downscaled 4x."""
BOXES = 4
"""Boxes per side of the image: a question names one of 4 x 4 boxes (112 px on a 448 px image)."""
CELLS = 4
"""Cells per side of a box's grid (a shape per cell, never overlapping)."""
PATCH = 14
"""The vision tower's patch side in pixels (Qwen-VL families), as the tests check the sizes."""
COUNTS = [1, 2, 3, 4]
FAMILIES = ("count", "color")
SIDE_CELL = (0.43, 0.86)
"""A count shape's side as a fraction of its cell (12-24 px of a 28 px cell on a 448 px image)."""
SIDE_CELL_COLOR = (0.3, 0.5)
"""A colour question's lone shape: smaller still (8-14 px on disk, 2-3.5 px in the prompt)."""
def stored_side(view: int) -> int:
    return view * ZOOM_FACTOR


def box_of(index: int, size: int) -> dict[str, int]:
    """The zoom arguments of box `index` (row-major over the 4 x 4 boxes) of a `size` px image."""
    side = size // BOXES
    return {"x": (index % BOXES) * side, "y": (index // BOXES) * side, "w": side, "h": side}


def _place(rng: random.Random, box: dict[str, int], colors: list[str],
           side_frac: tuple[float, float]) -> list[Shape]:
    """One shape per colour in distinct cells of `box`'s grid, each inside its cell (jittered)."""
    cell = box["w"] // CELLS
    shapes = []
    for idx, color in zip(rng.sample(range(CELLS * CELLS), len(colors)), colors):
        side = max(3, int(cell * rng.uniform(*side_frac)))
        slack = max(0, cell - side - 2)
        cx = box["x"] + (idx % CELLS) * cell + 1 + side // 2 + rng.randint(0, slack)
        cy = box["y"] + (idx // CELLS) * cell + 1 + side // 2 + rng.randint(0, slack)
        shapes.append(Shape(rng.choice(KINDS), color, cx, cy, side))
    return shapes


def _scene(family: str, rng: random.Random, size: int, pick: int) -> dict[str, Any]:
    target_box = rng.randrange(BOXES * BOXES)
    box = box_of(target_box, size)
    others = [box_of(i, size) for i in range(BOXES * BOXES) if i != target_box]
    where = f"the {box['w']} x {box['h']} px box at x={box['x']}, y={box['y']}"
    if family == "count":
        n = COUNTS[pick % len(COUNTS)]
        target = _place(rng, box, [rng.choice(COLOR_NAMES) for _ in range(n)], SIDE_CELL)
        rest = [s for b in rng.sample(others, 6)
                for s in _place(rng, b, [rng.choice(COLOR_NAMES)
                                         for _ in range(rng.randint(1, 4))], SIDE_CELL)]
        return {"box": box, "target": target, "shapes": target + rest, "answer": str(n),
                "prompt": f"How many shapes are in {where}?",
                "reasoning": f"The zoomed box shows {n} {plural('shape', n)}."}
    if family == "color":
        color = COLOR_NAMES[pick % len(COLOR_NAMES)]
        target = _place(rng, box, [color], SIDE_CELL_COLOR)
        rest = [s for b in rng.sample(others, 6)
                for s in _place(rng, b, [rng.choice([c for c in COLOR_NAMES if c != color])],
                                SIDE_CELL_COLOR)]
        return {"box": box, "target": target, "shapes": target + rest, "answer": color,
                "prompt": f"What colour is the shape in {where}?",
                "reasoning": f"The zoomed box shows a {color} shape."}
    raise ValueError(f"unknown zoom family {family!r}; known: {list(FAMILIES)}")


def render(shapes: list[Shape], size: int) -> Image.Image:
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    for s in shapes:
        x0, y0 = s.x - s.size // 2, s.y - s.size // 2
        x1, y1 = x0 + s.size - 1, y0 + s.size - 1
        fill = COLORS[s.color]
        if s.kind == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif s.kind == "square":
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        else:
            draw.polygon([(x0, y1), (x1, y1), ((x0 + x1) / 2, y0)], fill=fill)
    return img


def gold_trajectory(box: dict[str, int], reasoning: str, answer: str) -> list[dict[str, str]]:
    """The turns of the reference trajectory: the zoom call, then the final answer."""
    return [{"text": format_call("zoom", **box)},
            {"text": f"<think>{reasoning}</think><answer>{answer}</answer>"}]


def make_example(family: str, rng: random.Random, path: Path, view: int, pick: int) -> Example:
    size = stored_side(view)
    scene = _scene(family, rng, size, pick)
    render(scene["shapes"], size).save(path, format="PNG")
    box = scene["box"]
    evidence = [{"kind": s.kind, "color": s.color, "x": s.x - box["x"], "y": s.y - box["y"],
                 "size": s.size} for s in scene["target"]]
    meta = {"family": family, "box": box, "image_side": size,
            "view_side": view, "shapes": [s.to_json() for s in scene["shapes"]],
            "evidence": evidence,
            "trajectory": gold_trajectory(box, scene["reasoning"], scene["answer"])}
    if family == "color":
        meta["answer_set"] = list(COLOR_NAMES)
    return Example(id=path.stem, prompt=scene["prompt"], answer=scene["answer"],
                   images=[str(path)], reasoning=scene["reasoning"], meta=meta)


def vision_rows(examples: list[Example], out_dir: Path) -> list[Example]:
    """Rows for `mmrlvr pretrain-vision` (a real VLM's tower arrives able to see; a tiny random
    one does not): each image with the count and lone colour of each of its 16 boxes (what the
    prompt's view would need), and each question's box cropped as zoom cuts it (saved as
    `images/ID-box.png`) with its count and lone colour (what the zoom shows)."""
    out = []
    for ex in examples:
        size, meta = ex.meta["image_side"], ex.meta
        side = size // BOXES
        labels = {}
        for i in range(BOXES * BOXES):
            box = box_of(i, size)
            inside = [s for s in meta["shapes"] if box["x"] <= s["x"] < box["x"] + side
                      and box["y"] <= s["y"] < box["y"] + side]
            labels[f"n{i:02d}"] = str(len(inside))
            labels[f"c{i:02d}"] = inside[0]["color"] if len(inside) == 1 else ""
        out.append(Example(id=f"{ex.id}-image", prompt="(vision)", answer="-",
                           images=list(ex.images),
                           meta={"vision_labels": labels}))
        box = meta["box"]
        with Image.open(ex.images[0]) as im:
            crop = im.convert("RGB").crop((box["x"], box["y"], box["x"] + box["w"],
                                           box["y"] + box["h"]))
        path = out_dir / "images" / f"{ex.id}-box.png"
        crop.save(path, format="PNG")
        ev = meta["evidence"]
        out.append(Example(id=f"{ex.id}-box", prompt="(vision)", answer="-", images=[str(path)],
                           meta={"vision_labels": {"crop_n": str(len(ev)), "crop_c":
                                                   ev[0]["color"] if len(ev) == 1 else ""}}))
    return out


def _split(out_dir: Path, split: str, n: int, rng: random.Random, families: list[str],
           view: int) -> tuple[list[Example], dict[str, int]]:
    cells = {"count": len(COUNTS), "color": len(COLOR_NAMES)}
    order = []
    for j, f in enumerate(families):
        k = n // len(families) + (j < n % len(families))
        offset = rng.randrange(cells[f])
        order += [(f, (offset + i) % cells[f]) for i in range(k)]
    rng.shuffle(order)
    examples = [make_example(f, rng, out_dir / "images" / f"{split}-{i:06d}.png", view, pick)
                for i, (f, pick) in enumerate(order)]
    return examples, {f: sum(1 for g, _ in order if g == f) for f in families}


def make_zoom(out_dir: str | Path, *, n_train: int = 2000, n_test: int = 200, seed: int = 0,
              view: int = 112, families: list[str] | None = None) -> dict[str, Any]:
    """Write `images/*.png`, `train.jsonl`, `test.jsonl` and `info.json`; returns the info.
    `view` is the side the prompt shows (the model's max_pixels side); images are 4x that."""
    families = list(dict.fromkeys(families or FAMILIES))
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown zoom families {unknown}; known: {list(FAMILIES)}")
    if view % 28 or view < 56:
        raise ValueError(f"zoom: --image-size is the prompt's side and must be a multiple of 28 "
                         f"(the Qwen-VL resize grid) of at least 56, got {view}")
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train}, {n_test}")
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    train, train_counts = _split(out_dir, "train", n_train, random.Random(f"zoom-train-{seed}"),
                                 families, view)
    test, test_counts = _split(out_dir, "test", n_test, random.Random(f"zoom-test-{seed}"),
                               families, view)
    write_jsonl(train, out_dir / "train.jsonl")
    write_jsonl(test, out_dir / "test.jsonl")
    write_jsonl(vision_rows(train, out_dir), out_dir / "vision.jsonl")
    write_jsonl(vision_rows(test, out_dir), out_dir / "vision_test.jsonl")
    info = {"task": "zoom", "seed": seed, "view_side": view, "image_side": stored_side(view),
            "zoom_factor": ZOOM_FACTOR, "families": families, "n_train": n_train,
            "n_test": n_test, "counts": {"train": train_counts, "test": test_counts},
            "files": {"train": "train.jsonl", "test": "test.jsonl", "images": "images",
                      "vision": "vision.jsonl", "vision_test": "vision_test.jsonl"}}
    (out_dir / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


TASK = Task(
    "tiny shapes in one quarter of a 4x-downscaled image: count or colour them, with zoom "
    "(vision, multi-turn tools; --image-size is the prompt's side)",
    lambda out, o: make_zoom(out, n_train=o.n_train, n_test=o.n_test, seed=o.seed,
                             view=o.image_size, families=o.families))
