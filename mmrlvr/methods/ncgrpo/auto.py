"""`alpha: auto`: steer α so the noise moves the first-step distribution by a chosen amount.

A running controller, not a calibration pass: every generate call already measures the mean
first-step KL(noisy ‖ clean) and the clean sampling entropy H (probe.py) at no extra forward, so
after each call α moves towards the value that puts KL at `target · H`. For small noise the KL
grows as α² (a second-order expansion of the log-softmax around the clean logits), so the step
that would land on the target under that law is ½·log(target·H / KL) in log α; the controller
takes `GAIN` of it (the measurement is an average over a few noisy rows, and the law bends once
the noise is large), at most a factor `MAX_STEP` per call, within [`ALPHA_MIN`, `ALPHA_MAX`].

The state (α and the calls seen) is saved in each checkpoint through the rollout-branching
hook's `state_dict`, so a resumed run steers on from where it was.
"""
from __future__ import annotations

import math
from typing import Any

GAIN = 0.5
"""Share of the α²-law step taken per call: log-error halves each call under that law."""
MAX_STEP = 2.0
"""α changes by at most this factor per call (a bad measurement cannot throw it far)."""
ALPHA_MIN, ALPHA_MAX = 1e-3, 10.0
"""α stays in this range: at α 10 the noise's norm is ten times the hidden state's, the prefill
is mostly noise, and the KL it gives has stopped growing (a tiny random Qwen2.5-VL: 0.03 nat at
α 1, 0.11 at α 10, 0.11 at α 50). A target past what α 10 reaches leaves α there, and
`ncgrpo/alpha_at_max` says so."""


class AlphaController:
    """α for the next generate call, from what the last ones measured."""

    def __init__(self, target: float, alpha_init: float):
        self.target = float(target)
        self.alpha = float(alpha_init)
        self.calls = 0

    def observe(self, kl: float, entropy: float) -> None:
        """One call's mean first-step KL(noisy ‖ clean) and clean entropy H (nat/token)."""
        self.calls += 1
        goal = self.target * entropy
        if not (math.isfinite(kl) and math.isfinite(goal)) or goal <= 0:
            return                         # a deterministic first token: nothing to aim at
        if kl <= 0:                        # below float resolution: as far up as one step goes
            step = math.log(MAX_STEP)
        else:
            step = GAIN * 0.5 * math.log(goal / kl)
            step = max(-math.log(MAX_STEP), min(math.log(MAX_STEP), step))
        self.alpha = min(ALPHA_MAX, max(ALPHA_MIN, self.alpha * math.exp(step)))

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha, self.calls = float(state["alpha"]), int(state["calls"])
