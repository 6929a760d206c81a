"""Shapes: a seeded synthetic visual-reasoning dataset with verifiable answers.

Images are flat white or light-gray squares holding a few large, solid, non-overlapping shapes
(circle, square, triangle) in four saturated colours (red, green, blue, yellow), legible at
56-112 px for a tiny vision-language model. Seven task families ask about them
(`shapes_ood` draws the same families from a shifted `Dist` for `test_ood.jsonl`):

    count        How many shapes are in the image?                 -> "1".."5"
    color        What colour is the shape?                         -> red/green/blue/yellow
    kind         What shape is in the image?                       -> circle/square/triangle
    position     Is the red circle on the left or the right?       -> left/right
    count_color  How many blue shapes are there?                   -> "1".."4"
    arith        How many circles plus squares are there?          -> "2".."5"
                 How many more circles than squares are there?     -> "0".."3"
    yesno        Is there a green triangle in the image?           -> yes/no

The answer is fixed first, then a scene is built to match it: `make_shapes` deals each family's
answer cells evenly (exact balance), a bare generator draws one uniformly. Each family is a
generator `(rng, image_size, pick=None) -> Scene`; a
`Scene` holds the shapes and the text fields and renders itself with PIL. `make_shapes` writes
`images/*.png`, `train.jsonl`, `test.jsonl` and `info.json`; the same arguments give
byte-identical files. The test split uses its own derived seed and never repeats a train
(family, image, question) triple.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from PIL import Image, ImageDraw

from mmrlvr.data import Example, write_jsonl

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 20, 20),
    "green": (20, 160, 40),
    "blue": (20, 60, 220),
    "yellow": (245, 200, 0),
}
"""Shape colours by name (saturated, far apart; exact RGB since drawing is not anti-aliased)."""
KINDS: tuple[str, ...] = ("circle", "square", "triangle")
BACKGROUNDS: dict[str, tuple[int, int, int]] = {"white": (255, 255, 255), "gray": (235, 235, 235)}
SHIFTED_BACKGROUNDS: dict[str, tuple[int, int, int]] = {"slate": (200, 212, 228)}
"""Backgrounds no train/test scene uses (the out-of-distribution split's, `shapes_ood`)."""
COLOR_NAMES: tuple[str, ...] = tuple(COLORS)
GRID = 3
"""Multi-shape scenes place shapes in distinct cells of a GRID x GRID layout (never overlap)."""


@dataclass
class Shape:
    kind: str
    color: str
    x: int
    """Centre of the bounding box, in pixels (inside the shape for all three kinds)."""
    y: int
    size: int
    """Side of the square bounding box, in pixels."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "color": self.color, "x": self.x, "y": self.y,
                "size": self.size}


@dataclass
class Scene:
    """One generated item: what to draw and what to ask."""

    shapes: list[Shape]
    background: str
    prompt: str
    answer: str
    reasoning: str
    steps: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def render(self, image_size: int) -> Image.Image:
        fill = BACKGROUNDS.get(self.background) or SHIFTED_BACKGROUNDS[self.background]
        img = Image.new("RGB", (image_size, image_size), fill)
        draw = ImageDraw.Draw(img)
        for s in self.shapes:
            x0, y0 = s.x - s.size // 2, s.y - s.size // 2
            x1, y1 = x0 + s.size - 1, y0 + s.size - 1
            fill = COLORS[s.color]
            if s.kind == "circle":
                draw.ellipse((x0, y0, x1, y1), fill=fill)
            elif s.kind == "square":
                draw.rectangle((x0, y0, x1, y1), fill=fill)
            elif s.kind == "triangle":
                draw.polygon([(x0, y1), (x1, y1), ((x0 + x1) / 2, y0)], fill=fill)
            else:
                raise ValueError(f"unknown shape kind {s.kind!r}")
        return img

    def full_meta(self, family: str) -> dict[str, Any]:
        return {"family": family, **self.meta, "background": self.background,
                "shapes": [s.to_json() for s in self.shapes]}


# ----------------------------------------------------------------------------- words

def plural(kind: str, n: int) -> str:
    return kind if n == 1 else kind + "s"


def _be(n: int) -> str:
    return "is" if n == 1 else "are"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _groups(shapes: list[Shape]) -> list[tuple[int, str, str]]:
    """(count, colour, kind) groups in canonical order (colour order, then kind order)."""
    out = []
    for c in COLOR_NAMES:
        for k in KINDS:
            n = sum(1 for s in shapes if s.color == c and s.kind == k)
            if n:
                out.append((n, c, k))
    return out


def _describe(groups: list[tuple[int, str, str]]) -> str:
    return _join([f"{n} {c} {plural(k, n)}" for n, c, k in groups])


# ----------------------------------------------------------------------------- layout

def _grid_layout(rng: random.Random, specs: list[tuple[str, str]], size: int) -> list[Shape]:
    """Place (kind, colour) pairs in distinct grid cells, each large within its cell, jittered."""
    if len(specs) > GRID * GRID:
        raise ValueError(f"at most {GRID * GRID} shapes fit, got {len(specs)}")
    cell = size / GRID
    cells = rng.sample(range(GRID * GRID), len(specs))
    shapes = []
    for (kind, color), idx in zip(specs, cells):
        side = max(4, int(cell * rng.uniform(0.6, 0.85)))
        cx0, cy0 = (idx % GRID) * cell, (idx // GRID) * cell
        x = _place(rng, cx0, cx0 + cell, side)
        y = _place(rng, cy0, cy0 + cell, side)
        shapes.append(Shape(kind, color, x, y, side))
    return shapes


def _place(rng: random.Random, lo: float, hi: float, side: int) -> int:
    """A centre for a box of `side` px lying wholly inside [lo, hi) with 1 px of margin."""
    a = int(lo) + 1 + side // 2
    b = int(hi) - 1 - (side - side // 2)
    return rng.randint(a, b) if b > a else (a + b) // 2


def _single(rng: random.Random, kind: str, color: str, size: int, dist: Dist) -> Shape:
    side = int(size * rng.uniform(*dist.single_scale))
    return Shape(kind, color, _place(rng, 0, size, side), _place(rng, 0, size, side), side)


def _bg(rng: random.Random, dist: Dist, lone: bool = False) -> str:
    """A background name; `lone`: of a color/kind/position scene (`dist.lone_backgrounds`)."""
    return rng.choice(list(dist.lone_backgrounds if lone else dist.backgrounds))


def _shuffled(rng: random.Random, items: list) -> list:
    items = list(items)
    rng.shuffle(items)
    return items


# ----------------------------------------------------------------------------- families

ANSWER_CELLS: dict[str, list] = {
    "count": [1, 2, 3, 4, 5],
    "color": list(COLOR_NAMES),
    "kind": list(KINDS),
    "position": ["left", "right"],
    "count_color": [1, 2, 3, 4],
    "arith": [("plus", 2), ("plus", 3), ("plus", 4), ("plus", 5),
              ("minus", 0), ("minus", 1), ("minus", 2), ("minus", 3)],
    "yesno": [True, False],
}
"""Each family's answer cells (arith: (operation, answer)); answers are balanced over these."""


@dataclass(frozen=True)
class Dist:
    """What the generators draw from; the defaults are the train/test distribution
    (`shapes_ood` shifts it)."""

    cells: dict[str, list] = field(default_factory=lambda: ANSWER_CELLS)
    most: int = 5
    """Most shapes in a count_color / arith (minus) scene."""
    yesno_shapes: tuple[int, int] = (1, 4)
    single_scale: tuple[float, float] = (0.35, 0.6)
    """Side of a lone shape (color, kind) as a fraction of the image."""
    pair_scale: tuple[float, float] = (0.25, 0.4)
    """Side of each shape of a position scene as a fraction of the image."""
    backgrounds: tuple[str, ...] = tuple(BACKGROUNDS)
    """Backgrounds of the multi-shape scenes (count, count_color, arith, yesno)."""
    lone_backgrounds: tuple[str, ...] = tuple(BACKGROUNDS)
    """Backgrounds of the color, kind and position scenes."""


TRAIN = Dist()


def _choose(rng: random.Random, family: str, pick: int | None, dist: Dist = TRAIN):
    """The answer cell: `dist.cells[family][pick]` when dealt, else a uniform draw."""
    cells = dist.cells[family]
    return cells[pick % len(cells)] if pick is not None else rng.choice(cells)


def gen_count(rng: random.Random, size: int, pick: int | None = None, dist: Dist = TRAIN
              ) -> Scene:
    n = _choose(rng, "count", pick, dist)
    specs = [(rng.choice(KINDS), rng.choice(COLOR_NAMES)) for _ in range(n)]
    shapes = _grid_layout(rng, specs, size)
    groups = _groups(shapes)
    if len(groups) == 1:
        g = groups[0]
        total = f"That is {n} {plural('shape', n)}."
        reasoning = f"I see {_describe(groups)}. {total}"
        steps = [f"There {_be(g[0])} {_describe(groups)}.", total]
    else:
        arith = " + ".join(str(g[0]) for g in groups) + f" = {n}"
        reasoning = f"I see {_describe(groups)}. {arith}."
        steps = [f"There {_be(g[0])} {_describe([g])}." for g in groups] + [arith]
    return Scene(shapes, _bg(rng, dist), "How many shapes are in the image?", str(n), reasoning,
                 steps, {"count": n})


def gen_color(rng: random.Random, size: int, pick: int | None = None, dist: Dist = TRAIN
              ) -> Scene:
    color, kind = _choose(rng, "color", pick, dist), rng.choice(KINDS)
    shapes = [_single(rng, kind, color, size, dist)]
    return Scene(shapes, _bg(rng, dist, lone=True), "What colour is the shape?", color,
                 f"I see 1 {color} {kind}. Its colour is {color}.",
                 [f"There is 1 {color} {kind}.", f"Its colour is {color}."],
                 {"color": color, "answer_set": list(COLOR_NAMES)})


def gen_kind(rng: random.Random, size: int, pick: int | None = None, dist: Dist = TRAIN
             ) -> Scene:
    kind, color = _choose(rng, "kind", pick, dist), rng.choice(COLOR_NAMES)
    shapes = [_single(rng, kind, color, size, dist)]
    return Scene(shapes, _bg(rng, dist, lone=True), "What shape is in the image?", kind,
                 f"I see 1 {color} {kind}. It is a {kind}.",
                 [f"There is 1 {color} {kind}.", f"It is a {kind}."],
                 {"kind": kind, "answer_set": list(KINDS)})


def gen_position(rng: random.Random, size: int, pick: int | None = None, dist: Dist = TRAIN
                 ) -> Scene:
    side_ans = _choose(rng, "position", pick, dist)
    k1, k2 = rng.sample(KINDS, 2)
    c1, c2 = rng.sample(COLOR_NAMES, 2)
    half = size / 2
    shapes = []
    for (kind, color), (lo, hi) in zip(((k1, c1), (k2, c2)),
                                       ((0, half), (half, size)) if side_ans == "left"
                                       else ((half, size), (0, half))):
        side = max(4, int(size * rng.uniform(*dist.pair_scale)))
        shapes.append(Shape(kind, color, _place(rng, lo, hi, side), _place(rng, 0, size, side),
                            side))
    other = "right" if side_ans == "left" else "left"
    first = f"The {c1} {k1} is on the {side_ans}."
    second = f"The {c2} {k2} is on the {other}."
    return Scene(_shuffled(rng, shapes), _bg(rng, dist, lone=True),
                 f"Is the {c1} {k1} on the left or the right?", side_ans,
                 f"{first} {second}", [first, second],
                 {"target": {"kind": k1, "color": c1}, "side": side_ans})


def gen_count_color(rng: random.Random, size: int, pick: int | None = None, dist: Dist = TRAIN
                    ) -> Scene:
    k = _choose(rng, "count_color", pick, dist)
    n = rng.randint(k + 1, dist.most)
    target, other = rng.sample(COLOR_NAMES, 2)
    specs = [(rng.choice(KINDS), target) for _ in range(k)]
    specs += [(rng.choice(KINDS), other) for _ in range(n - k)]
    shapes = _grid_layout(rng, _shuffled(rng, specs), size)
    s1 = f"There {_be(k)} {k} {target} {plural('shape', k)}."
    s2 = f"There {_be(n - k)} {n - k} {other} {plural('shape', n - k)}."
    return Scene(shapes, _bg(rng, dist), f"How many {target} shapes are there?", str(k),
                 f"I see {k} {target} {plural('shape', k)} and {n - k} {other} "
                 f"{plural('shape', n - k)}. So {k} {_be(k)} {target}.",
                 [s1, s2], {"color": target, "other_color": other, "count": k})


def gen_arith(rng: random.Random, size: int, pick: int | None = None, dist: Dist = TRAIN
              ) -> Scene:
    op, ans = _choose(rng, "arith", pick, dist)
    if op == "plus":
        a = rng.randint(1, ans - 1)
        b = ans - a
    else:
        b = rng.randint(1, (dist.most - ans) // 2)
        a = b + ans
    ka, kb = rng.sample(KINDS, 2)
    specs = [(ka, rng.choice(COLOR_NAMES)) for _ in range(a)]
    specs += [(kb, rng.choice(COLOR_NAMES)) for _ in range(b)]
    shapes = _grid_layout(rng, _shuffled(rng, specs), size)
    sign = "+" if op == "plus" else "-"
    eq = f"{a} {sign} {b} = {ans}"
    if op == "plus":
        prompt = f"How many {plural(ka, 2)} plus {plural(kb, 2)} are there?"
    else:
        prompt = f"How many more {plural(ka, 2)} than {plural(kb, 2)} are there?"
    return Scene(shapes, _bg(rng, dist), prompt, str(ans),
                 f"I see {a} {plural(ka, a)} and {b} {plural(kb, b)}. {eq}.",
                 [f"There {_be(a)} {a} {plural(ka, a)}.", f"There {_be(b)} {b} {plural(kb, b)}.",
                  eq],
                 {"op": op, "kinds": [ka, kb], "counts": [a, b]})


def gen_yesno(rng: random.Random, size: int, pick: int | None = None, dist: Dist = TRAIN
              ) -> Scene:
    present = _choose(rng, "yesno", pick, dist)
    tk, tc = rng.choice(KINDS), rng.choice(COLOR_NAMES)
    n = rng.randint(*dist.yesno_shapes)
    others = [(k, c) for k in KINDS for c in COLOR_NAMES if (k, c) != (tk, tc)]
    # distractors that share the colour or the kind make "no" scenes less trivial
    near = [(k, c) for k, c in others if k == tk or c == tc]
    specs = [(tk, tc)] if present else []
    while len(specs) < n:
        specs.append(rng.choice(near if rng.random() < 0.5 else others))
    shapes = _grid_layout(rng, _shuffled(rng, specs), size)
    seen = f"I see {_describe(_groups(shapes))}."
    verdict = f"There is a {tc} {tk}." if present else f"There is no {tc} {tk}."
    return Scene(shapes, _bg(rng, dist), f"Is there a {tc} {tk} in the image?",
                 "yes" if present else "no", f"{seen} {verdict}", [seen, verdict],
                 {"target": {"kind": tk, "color": tc}, "present": present})


Generator = Callable[..., Scene]
FAMILIES: dict[str, Generator] = {
    "count": gen_count,
    "color": gen_color,
    "kind": gen_kind,
    "position": gen_position,
    "count_color": gen_count_color,
    "arith": gen_arith,
    "yesno": gen_yesno,
}
"""Task family name -> generator `(rng, image_size, pick=None) -> Scene`.

`pick` indexes the family's `ANSWER_CELLS` (modulo their number) to fix the answer; without it
the answer cell is drawn uniformly. `make_shapes` deals cells evenly, so splits are exactly
balanced within each family (to one item per cell).
"""


# ----------------------------------------------------------------------------- examples

def _scene(family: str, rng: random.Random, image_size: int, pick: int | None = None,
           dist: Dist = TRAIN) -> Scene:
    if family not in FAMILIES:
        raise ValueError(f"unknown shapes family {family!r}; known: {list(FAMILIES)}")
    if image_size < 28:
        raise ValueError(f"image_size must be at least 28 px, got {image_size}")
    return FAMILIES[family](rng, image_size, pick, dist)


def _example(family: str, scene: Scene, image_path: Path) -> Example:
    return Example(id=image_path.stem, prompt=scene.prompt, answer=scene.answer,
                   images=[str(image_path)], reasoning=scene.reasoning, steps=list(scene.steps),
                   meta=scene.full_meta(family))


def make_example(family: str, rng: random.Random, image_path: Path, image_size: int, *,
                 pick: int | None = None) -> Example:
    """Draw one `family` item with `rng`, save its PNG at `image_path`, return the Example.

    The Example's id is the image file's stem. `pick` fixes the answer cell (see `FAMILIES`).
    """
    image_path = Path(image_path)
    scene = _scene(family, rng, image_size, pick)
    image_path.parent.mkdir(parents=True, exist_ok=True)
    scene.render(image_size).save(image_path, format="PNG")
    return _example(family, scene, image_path)


def reference_completion(ex: Example) -> str:
    """The supervised target: `<think>reasoning</think><answer>answer</answer>`."""
    return f"<think>{ex.reasoning or ''}</think><answer>{ex.answer}</answer>"


def _allocate(n: int, weights: dict[str, float]) -> dict[str, int]:
    """Split n over families in proportion to weights (largest remainder; ties by order)."""
    total = sum(weights.values())
    exact = {f: n * w / total for f, w in weights.items()}
    counts = {f: int(v) for f, v in exact.items()}
    order = sorted(weights, key=lambda f: (-(exact[f] - counts[f]), list(weights).index(f)))
    for f in order[: n - sum(counts.values())]:
        counts[f] += 1
    return counts


def _weights(families: list[str] | None, mix: dict[str, float] | None) -> dict[str, float]:
    if families is None:
        families = list(mix) if mix else list(FAMILIES)
    families = list(dict.fromkeys(families))
    if not families:
        raise ValueError("shapes: no families selected")
    unknown = [f for f in [*families, *(mix or {})] if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown shapes families {unknown}; known: {list(FAMILIES)}")
    if mix is None:
        return {f: 1.0 for f in families}
    if set(mix) != set(families):
        raise ValueError(f"shapes mix must weight exactly the selected families {families}, "
                         f"got weights for {sorted(mix)}")
    weights = {f: float(mix[f]) for f in families}
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"shapes mix weights must be >= 0 with a positive sum, got {mix}")
    return weights


def _content_key(family: str, scene: Scene, img: Image.Image) -> tuple[str, str, str]:
    return family, hashlib.sha1(img.tobytes()).hexdigest(), scene.prompt


def _split(out_dir: Path, split: str, n: int, rng: random.Random, weights: dict[str, float],
           image_size: int, avoid: set, keys: set, dist: Dist = TRAIN
           ) -> tuple[list[Example], dict[str, int]]:
    counts = _allocate(n, weights)
    order = []
    for f in weights:  # deal each family's answer cells evenly, in a shuffled order
        cells = len(dist.cells[f])
        offset = rng.randrange(cells)  # which cells get the remainder varies with the seed
        picks = [(offset + j) % cells for j in range(counts[f])]
        rng.shuffle(picks)
        order += [(f, pick) for pick in picks]
    rng.shuffle(order)
    examples = []
    for i, (family, pick) in enumerate(order):
        for _ in range(1000):
            scene = _scene(family, rng, image_size, pick, dist)
            img = scene.render(image_size)
            key = _content_key(family, scene, img)
            if key not in avoid:
                break
        else:
            raise RuntimeError(f"shapes: could not draw a {split} {family} item unlike the "
                               f"train split (image_size {image_size} too small?)")
        keys.add(key)
        path = out_dir / "images" / f"{split}-{i:06d}.png"
        img.save(path, format="PNG")
        examples.append(_example(family, scene, path))
    return examples, counts


def make_shapes(out_dir: str | Path, *, n_train: int = 2000, n_test: int = 200, seed: int = 0,
                image_size: int = 112, families: list[str] | None = None,
                mix: dict[str, float] | None = None) -> dict:
    """Write a shapes dataset to `out_dir` and return its info dict (also saved as info.json).

    Files: `images/{train,test}-NNNNNN.png`, `train.jsonl`, `test.jsonl` (image paths relative
    to the file) and `info.json`. `families` defaults to all (or to `mix`'s keys); `mix` gives
    relative family weights (default uniform), split exactly by largest remainder. Each split
    draws from its own seed derived from `seed`; test items never repeat a train item's
    (family, image pixels, question).
    """
    out_dir = Path(out_dir)
    weights = _weights(families, mix)
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train}, {n_test}")
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    train_keys: set = set()
    train, train_counts = _split(out_dir, "train", n_train, random.Random(f"shapes-train-{seed}"),
                                 weights, image_size, set(), train_keys)
    test, test_counts = _split(out_dir, "test", n_test, random.Random(f"shapes-test-{seed}"),
                               weights, image_size, train_keys, set())
    write_jsonl(train, out_dir / "train.jsonl")
    write_jsonl(test, out_dir / "test.jsonl")
    info = {
        "task": "shapes",
        "seed": seed,
        "image_size": image_size,
        "families": list(weights),
        "mix": weights,
        "n_train": n_train,
        "n_test": n_test,
        "counts": {"train": train_counts, "test": test_counts},
        "files": {"train": "train.jsonl", "test": "test.jsonl", "images": "images"},
    }
    (out_dir / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info

# The task entry (`mmrlvr data shapes`, with `--ood`) is `mmrlvr.tasks.shapes_ood.TASK`.
