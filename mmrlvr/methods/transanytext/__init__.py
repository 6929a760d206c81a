"""TransAnyText: image-text translation as renderable HTML patches (docs/transanytext.md).

The translation reward (`reward.py`, reward `translation`: format, position, chrF, style), PWSD
(`pwsd.py`, objective `pwsd`: distillation towards the privileged teacher, with DASH's gates in
`dash.py`, docs/dash.md). The `image_translation` modality and the SFT → PWSD chain
(`mmrlvr sft`, `sft.pwsd`) feed it. The diffusion stage of `mmrlvr translate` (erase and refine
with a local diffusers pipeline, OpenCV on CPU) is `diffusion.py`. Off: neither named in the
config (training), `--eraser opencv` (translate).
"""
from __future__ import annotations

from mmrlvr.objectives import OBJECTIVES
from rewards import REWARDS

REWARDS.register("translation", "mmrlvr.methods.transanytext.reward:TranslationReward")
OBJECTIVES.register("pwsd", "mmrlvr.methods.transanytext.pwsd:PWSD")
