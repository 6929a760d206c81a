"""NC-GRPO behind the core's rollout-branching hook (`mmrlvr.rollout.base.RolloutBranching`).

The engines know no noise: they ask this plug-in for a plan per generate call (`NoisePlan`:
the HF engine enters its prefill hook, the vLLM engine sends each noisy member as its own request
carrying its `RowNoise`), for the vLLM engine's extra set-up (a worker extension whose hooks
displace the prompt rows, eager mode, vLLM's V1 model runner) and its check after each call, and
for the trainer's `branch/*` figures. With `alpha: 0` the members are tagged but nothing is
displaced, so the vLLM engine is built and run exactly as for plain GRPO (a placebo control).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmrlvr.methods.ncgrpo.branching import Branching, NoisePlan, RowNoise, branch_metrics, make_plan
from mmrlvr.methods.ncgrpo.vllm_noise import WORKER_EXTENSION, noise_extra_args


class LatentNoise:
    """`rollout.branching: {kind: latent_noise, fraction, alpha, site, noise}`."""

    kind = "latent_noise"
    supports_compiled = False
    """`rollout.decode: compiled` would skip the prefill hook."""

    def __init__(self, config: Mapping[str, Any]):
        self.config = Branching.from_config(dict(config))

    @property
    def noise_on(self) -> bool:
        """Whether any hidden state is ever displaced (alpha > 0)."""
        return self.config.alpha > 0

    def plan(self, n_prompts: int, group_size: int) -> NoisePlan:
        return make_plan(self.config, n_prompts, group_size)

    def metrics(self, rollouts, scores) -> dict[str, float]:
        return branch_metrics(rollouts, scores)

    # -- the vLLM engine ------------------------------------------------------------------------
    def vllm_llm_kwargs(self) -> dict[str, Any]:
        """The worker extension carrying the hooks, and eager mode (CUDA graphs and vLLM's
        torch.compile skip Python hooks, so rollouts are slower)."""
        return dict(enforce_eager=True, worker_extension_cls=WORKER_EXTENSION) if self.noise_on else {}

    def vllm_env(self) -> dict[str, str]:
        """The hooks read the V1 model runner's `input_batch` / `requests`."""
        return {"VLLM_USE_V2_MODEL_RUNNER": "0"} if self.noise_on else {}

    def vllm_setup(self, llm) -> None:
        if self.noise_on:
            llm.collective_rpc("mmrlvr_install_noise", args=(self.config.site,))

    def vllm_extra_args(self, payload: RowNoise) -> dict[str, Any]:
        return noise_extra_args(payload)

    def vllm_check(self, llm, displaced: int) -> dict[str, float]:
        """The hooks' counters since the last call: every noisy request displaced, all of its
        prompt tokens (a prefix-cache hit or a forward the hook missed would show here)."""
        if not self.noise_on:
            return {}
        counts = llm.collective_rpc("mmrlvr_noise_counts")[0]
        if counts["requests"] != displaced or counts["noised"] < counts["expected"]:
            raise RuntimeError(
                f"latent-noise branching on vLLM: {displaced} noisy requests were sent but the "
                f"hook displaced {counts['requests']} of them, {counts['noised']} of their "
                f"{counts['expected']} prompt tokens (a prefix-cache hit or a forward the hook "
                "missed); set rollout.backend: hf or rollout.branching.kind: none")
        return {"branch/noised_prompt_tokens": counts["noised"]}
