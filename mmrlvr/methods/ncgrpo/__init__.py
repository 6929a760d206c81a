"""NC-GRPO: latent-noise rollout branching (docs/ncgrpo.md; docs/methods.md, "NC-GRPO").

A `fraction` of each group (the last ⌊fraction·G + ½⌋ members) samples from a displaced start:
Gaussian noise of scale α·‖h_t‖/√d on the language model's hidden states at the prompt positions,
during the prefill only; decoding and the weights are untouched, so training logprobs come from
the clean model and advantages are computed over the whole group as in plain GRPO.

Switch: `rollout.branching: {kind: latent_noise, fraction: 0.5, alpha: 0.1, site:
last_layer_input, noise: independent}`; off (`kind: none`, the default) is plain GRPO, bit for
bit. It plugs into the core's rollout-branching hook (`mmrlvr.rollout.base.BRANCHINGS`):
`plugin.py` (the plug-in), `branching.py` (config, plan, the HF prefill hook, `branch/*`
metrics), `vllm_noise.py` (the hooks inside vLLM's model runner), `probe.py` (what the noise did:
`ncgrpo/*`), `auto.py` (`alpha: auto`), `check.py` (`mmrlvr check-method ncgrpo`), `image_noise.py` (`kind: image_noise`, the pixel-space
baseline).
"""
from __future__ import annotations

from mmrlvr.core.registry import METHOD_CHECKS
from mmrlvr.rollout.base import BRANCHINGS

BRANCHINGS.register("latent_noise", "mmrlvr.methods.ncgrpo.plugin:LatentNoise")
BRANCHINGS.register("image_noise", "mmrlvr.methods.ncgrpo.plugin:ImageNoise")
METHOD_CHECKS.register("ncgrpo", "mmrlvr.methods.ncgrpo.check:check")
