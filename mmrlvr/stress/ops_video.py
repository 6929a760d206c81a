"""Video stress operators for `mmrlvr stress`: frames dropped, frames played backwards.

Each operator reads every video of an example as frames (`mmrlvr.data.read_video`, at most
`MAX_FRAMES`, spread evenly over the source), changes them and hands the adapter the new frames
as a frame list of PIL images (in memory, as the image operators hand over their images);
examples without video are skipped (None). Choices are drawn from the generator seeded by (seed,
operator, example id) that every operator gets.

    frame_drop   a quarter of the frames dropped (never the first or the last), order kept;
                 kind `video`: the gold stands. Rows whose `meta.needs_every_frame` is true
                 (counting blinks: a dropped frame may hold one) are skipped.
    frame_order  the frames reversed. It changes what the clip shows, so the gold becomes the
                 row's `meta.reversed_answer` (motion's direction: the opposite way; blink: the
                 same count; `Operator.changes_gold`). Rows without one, or with null (the
                 question means nothing backwards), are skipped: no gold can be known for them.

Both are of the kind `video`, reported apart from the prompt operators' robustness figure.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any

from PIL import Image

from mmrlvr.data import Example, read_video
from mmrlvr.stress.ops import Operator, Variant

MAX_FRAMES = 32
"""The most frames an operator reads from one video (a longer one is read at even steps)."""
DROP = 0.25
"""The share of frames `frame_drop` removes."""


def video_frames(video: Any, example: Example) -> list[Image.Image]:
    """A video's frames (every one, up to `MAX_FRAMES`); errors name the sample."""
    clip = read_video(video, fps=1e6, max_frames=MAX_FRAMES, what=f"sample {example.id}: video")
    return clip.frames


def drop_frames(frames: list[Image.Image], rng: random.Random,
                share: float = DROP) -> list[Image.Image]:
    """`frames` less `share` of them, chosen by `rng` among all but the first and last; at least
    two are kept."""
    inner = list(range(1, len(frames) - 1))
    n = min(len(inner), max(1, round(share * len(frames))))
    gone = set(rng.sample(inner, n)) if inner else set()
    return [f for k, f in enumerate(frames) if k not in gone]


def op_frame_drop(ex: Example, fmt: str, rng: random.Random) -> Variant | None:
    if not ex.videos or ex.meta.get("needs_every_frame"):
        return None
    videos = [drop_frames(video_frames(v, ex), rng) for v in ex.videos]
    return Variant(dataclasses.replace(ex, videos=videos), fmt)


def op_frame_order(ex: Example, fmt: str, rng: random.Random) -> Variant | None:
    gold = ex.meta.get("reversed_answer")
    if not ex.videos or gold is None:
        return None
    videos = [video_frames(v, ex)[::-1] for v in ex.videos]
    return Variant(dataclasses.replace(ex, videos=videos, answer=str(gold)), fmt)


def operators() -> dict[str, Operator]:
    """The video operators, by name."""
    ops = [
        Operator("frame_drop", "video", f"{DROP:.0%} of the frames dropped (not the first or "
                 "last), order kept", op_frame_drop),
        Operator("frame_order", "video", "the frames reversed; the gold becomes "
                 "meta.reversed_answer (rows without one are skipped)", op_frame_order,
                 changes_gold=True),
    ]
    return {op.name: op for op in ops}
