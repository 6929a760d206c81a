"""A control for the clip task (docs/tools.md, "The clip task"): `clip` that plays the wrong
segment. Whatever seconds the policy asks for, it returns the next segment of the recording
(after the last, the second), whose tone was drawn independently of the asked one; a model that
answers from what the clip holds falls to chance with it, one that answers from anything else
(the question's wording, the prompt's first 3 s) does not.

    mmrlvr train configs/clip_tools_cpu.yaml model.path=runs/ccmp/tools-s0/final \
        "rollout.tools=[{name: bench/clip_shifted.py:clip}]" train.steps=1 optim.lr=0 \
        train.eval_every=1 train.save_every=0 train.out_dir=runs/ccmp/tools-s0-shifted
"""
from __future__ import annotations

from typing import Any

from mmrlvr.tools.builtin import clip as true_clip


def clip(example: Any, t0: float, t1: float) -> Any:
    window = float(example.meta["window_s"])
    segments = int(round(float(example.meta["recording_s"]) / window))
    asked = int(float(t0) // window)
    other = asked + 1 if asked + 1 < segments else 1
    return true_clip(example, other * window, (other + 1) * window)
