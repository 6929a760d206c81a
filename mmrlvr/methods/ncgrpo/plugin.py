"""NC-GRPO behind the core's rollout-branching hook (`mmrlvr.rollout.base.RolloutBranching`).

The engines know no noise: they ask this plug-in for a plan per generate call (`NoisePlan`:
the HF engine enters its prefill hook, the vLLM engine sends each noisy member as its own request
carrying its `RowNoise`), for the vLLM engine's extra set-up (a worker extension whose hooks
displace the prompt rows, eager mode, vLLM's V1 model runner) and its check after each call, and
for the trainer's `branch/*` and `ncgrpo/*` figures. With `alpha: 0` the members are tagged but
nothing is displaced, so the vLLM engine is built and run exactly as for plain GRPO (a placebo
control). On the HF engine every call also measures what the noise did (probe.py: first-step
KL(noisy ‖ clean) against the clean entropy), which `alpha: auto` steers by (auto.py).
"""
from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

from mmrlvr.methods.ncgrpo.auto import ALPHA_MAX, AlphaController
from mmrlvr.methods.ncgrpo.branching import Branching, NoisePlan, RowNoise, branch_metrics, make_plan
from mmrlvr.methods.ncgrpo.image_noise import ImageNoiseConfig, make_pixel_plan
from mmrlvr.methods.ncgrpo.probe import answers_differ, first_step, first_step_figures
from mmrlvr.methods.ncgrpo.vllm_noise import WORKER_EXTENSION, noise_extra_args
from mmrlvr.rollout.diversity import final_answers


class Measured:
    """A plan with the first-step probe around its own hooks (`BranchPlan`): after `generate`,
    `stats` gives the call's `ncgrpo/*` figures and hands them to `observe` (the α controller)."""

    def __init__(self, plan, observe=None, figures: dict[str, float] | None = None):
        self.plan, self.observe, self.extra = plan, observe, dict(figures or {})
        self.probe = None

    @property
    def active(self) -> bool:
        return self.plan.active

    @property
    def flags(self) -> list[bool]:
        return self.plan.flags

    def tags(self) -> list[str]:
        return self.plan.tags()

    def row(self, r: int):
        return self.plan.row(r)

    @contextmanager
    def hooks(self, model, row_mask):
        with ExitStack() as stack:
            self.probe = stack.enter_context(first_step(model, len(self.plan.flags)))
            yield stack.enter_context(self.plan.hooks(model, row_mask))

    def stats(self, temperature: float) -> dict[str, float]:
        logits = self.probe.logits if self.probe is not None else None
        out = first_step_figures(logits, self.plan.flags, self.plan.group_size, temperature)
        if self.observe is not None and "ncgrpo/first_step_kl" in out:
            self.observe(out["ncgrpo/first_step_kl"], out["ncgrpo/clean_entropy"])
        return {**self.extra, **out} if any(self.plan.flags) else {}


def ncgrpo_metrics(rollouts, scores) -> dict[str, float]:
    """`branch/*` (branching.py), the call's `ncgrpo/*` figures the engine put in
    `Rollouts.stats`, and the groups whose noisy answers differ from their clean ones."""
    out = branch_metrics(rollouts, scores)
    if "noisy" not in rollouts.branch:
        return out
    out.update({k: float(v) for k, v in rollouts.stats.items() if k.startswith("ncgrpo/")})
    out.update(answers_differ(final_answers(rollouts), rollouts.branch, rollouts.group_size))
    return out


class LatentNoise:
    """`rollout.branching: {kind: latent_noise, fraction, alpha, site, noise}`."""

    kind = "latent_noise"
    options = Branching
    """The options of its `rollout.branching` mapping (checked before the model loads)."""
    supports_compiled = False
    """`rollout.decode: compiled` would skip the prefill hook."""

    def __init__(self, config: Mapping[str, Any]):
        self.config = Branching.from_config(dict(config))
        self.controller = AlphaController(self.config.target, self.config.alpha_init) \
            if self.config.auto else None

    @property
    def noise_on(self) -> bool:
        """Whether any hidden state is ever displaced (alpha > 0 or auto)."""
        return self.config.auto or self.config.alpha > 0

    def plan(self, n_prompts: int, group_size: int) -> Measured:
        if self.controller is None:
            return Measured(make_plan(self.config, n_prompts, group_size),
                            figures={"ncgrpo/alpha": float(self.config.alpha)})
        alpha = self.controller.alpha
        return Measured(make_plan(self.config, n_prompts, group_size, alpha=alpha),
                        self.controller.observe,
                        {"ncgrpo/alpha": alpha,
                         "ncgrpo/kl_target_over_entropy": self.controller.target,
                         "ncgrpo/alpha_at_max": float(alpha >= ALPHA_MAX)})

    def metrics(self, rollouts, scores) -> dict[str, float]:
        return ncgrpo_metrics(rollouts, scores)

    def state_dict(self) -> dict[str, Any]:
        """The α controller's state (`alpha: auto`), saved with each checkpoint."""
        return {} if self.controller is None else self.controller.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.controller is not None and state:
            self.controller.load_state_dict(state)

    # -- the vLLM engine ------------------------------------------------------------------------
    def vllm_llm_kwargs(self) -> dict[str, Any]:
        """The worker extension carrying the hooks, and eager mode (CUDA graphs and vLLM's
        torch.compile skip Python hooks, so rollouts are slower)."""
        if self.config.auto:
            raise ValueError("rollout.branching.alpha: auto steers by the first-step KL the HF "
                             "engine measures, which the vLLM engine does not return; set "
                             "rollout.backend: hf or a number for alpha (the HF run's "
                             "ncgrpo/alpha tells which)")
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


class ImageNoise:
    """`rollout.branching: {kind: image_noise, fraction, sigma}` (image_noise.py): the
    NoisyRollout-style baseline, with the same `branch/*` and `ncgrpo/*` figures as latent noise
    so the two can be read side by side. HF engine only."""

    kind = "image_noise"
    options = ImageNoiseConfig
    supports_compiled = False
    """Its hooks sit on the model's top module, whose decode step `compiled` would trace."""

    def __init__(self, config: Mapping[str, Any]):
        self.config = ImageNoiseConfig.from_config(config)

    def plan(self, n_prompts: int, group_size: int) -> Measured:
        return Measured(make_pixel_plan(self.config, n_prompts, group_size),
                        figures={"ncgrpo/sigma": self.config.sigma})

    def metrics(self, rollouts, scores) -> dict[str, float]:
        return ncgrpo_metrics(rollouts, scores)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def vllm_llm_kwargs(self) -> dict[str, Any]:
        raise ValueError("rollout.branching.kind: image_noise runs on the HF engine only "
                         "(set rollout.backend: hf)")

    def vllm_env(self) -> dict[str, str]:
        return {}

    def vllm_setup(self, llm) -> None:
        pass

    def vllm_extra_args(self, payload) -> dict[str, Any]:
        return {}

    def vllm_check(self, llm, displaced: int) -> dict[str, float]:
        return {}
