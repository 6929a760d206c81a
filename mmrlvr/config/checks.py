"""Checks of config values that need no model: ranges of every numeric key, list items, and
the model path, all problems reported together before anything loads."""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmrlvr.config.schema import (
    DECODES,
    EVAL_SET_NAME,
    PACKING_ATTENTION,
    RESERVED_EVAL_NAMES,
    TRACKERS,
    Config,
    ConfigError,
)
from mmrlvr.config.synonyms import value_hint
from mmrlvr.core.format_prompt import check_format_prompt
from mmrlvr.config.tool_checks import tool_problems


def _raise(problems: list[str]) -> None:
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems in the config (fix them all, then rerun):\n"
                          + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class Bound:
    """An allowed interval for a numeric key; `str()` reads like `>= 1` or `in (0, 1]`."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, v: float) -> bool:
        if isinstance(v, float) and not math.isfinite(v):
            return False
        above = v > self.low if self.low_open else v >= self.low
        below = self.high is None or (v < self.high if self.high_open else v <= self.high)
        return above and below

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        return (f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}"
                f"{')' if self.high_open else ']'}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


POSITIVE, NON_NEGATIVE, AT_LEAST_1 = Bound(0, low_open=True), Bound(0), Bound(1)


FRACTION = Bound(0, 1)

MAX_LR = 1.0
"""The largest learning rate accepted: no AdamW run trains above it (typical: 1e-6 to 1e-3)."""


GREEDY_HINT = ("0 means greedy decoding, but GRPO needs sampled groups: a greedy group is G "
               "copies of one completion, so every advantage is 0 and nothing is learnt; "
               "use e.g. 0.7–1.0")


RANGES: list[tuple[str, Bound, str]] = [
    # (key, allowed values, what to do): every numeric key whose bad value would crash the run
    # after the model loads, or quietly do something other than asked
    ("model.lora.r", NON_NEGATIVE, "the LoRA rank, e.g. 8; 0 trains the full model"),
    ("model.lora.alpha", AT_LEAST_1, "the LoRA scale numerator, e.g. 2·r"),
    ("model.lora.dropout", Bound(0, 1, high_open=True), "e.g. 0.0 or 0.05"),
    ("model.min_pixels", NON_NEGATIVE, "the smallest image area after resizing, e.g. 3136 "
                                       "(56·56); 0 takes the model processor's"),
    ("model.max_pixels", NON_NEGATIVE, "the largest image area after resizing, e.g. 12544 "
                                       "(112·112) for a tiny model; 0 takes the model "
                                       "processor's"),
    ("data.eval_limit", NON_NEGATIVE, "0 evaluates every held-out row"),
    ("data.max_image_pixels", AT_LEAST_1,
     "the largest image (width × height) accepted, e.g. 64000000"),
    ("data.max_audio_seconds", POSITIVE, "the longest audio clip accepted, e.g. 600"),
    ("data.max_video_seconds", POSITIVE, "the longest video accepted, e.g. 600"),
    ("data.video_fps", POSITIVE, "frames sampled per second of video, e.g. 2.0 (qwen-vl-utils')"),
    ("data.max_frames", Bound(2), "the most frames sampled from one video, an even number such as "
                                  "16 (Qwen-VL merges frames in pairs)"),
    ("data.max_video_pixels", NON_NEGATIVE, "the largest frame area after resizing, e.g. 12544 "
                                            "(112·112); 0 takes model.max_pixels"),
    ("data.max_prompt_tokens", NON_NEGATIVE, "the longest prompt in tokens, media included, "
                                             "e.g. 4096; 0 leaves only the model's context"),
    ("rollout.group_size", Bound(2), "GRPO compares the completions of a group; use e.g. 4–16"),
    ("rollout.max_new_tokens", NON_NEGATIVE, "the longest completion in tokens, e.g. 64 (tiny "
                                             "CPU model) to 1024 or more (long reasoning); 0 "
                                             "takes the model's generation config"),
    ("rollout.temperature", POSITIVE, GREEDY_HINT),
    ("rollout.top_p", Bound(0, 1, low_open=True), "1.0 turns nucleus sampling off"),
    ("rollout.top_k", NON_NEGATIVE, "0 turns top-k sampling off"),
    ("rollout.vllm_gpu_memory_utilization", Bound(0, 1, low_open=True, high_open=True),
     "the share of GPU memory vLLM's KV cache takes, e.g. 0.5"),
    ("algo.beta", NON_NEGATIVE, "the KL coefficient, e.g. 0.04; 0 loads no reference model"),
    ("algo.clip_low", NON_NEGATIVE, "the lower PPO clip epsilon, e.g. 0.2"),
    ("algo.clip_high", NON_NEGATIVE, "the upper PPO clip epsilon, e.g. 0.28 (DAPO clip-higher)"),
    ("algo.ppo_epochs", AT_LEAST_1, "passes over each batch of rollouts, e.g. 1"),
    ("algo.eps", POSITIVE, "keeps the advantage finite when a group's rewards are all equal; "
                           "e.g. 1e-6"),
    ("algo.norm_len", NON_NEGATIVE, "0 uses rollout.max_new_tokens"),
    ("algo.router_aux_coef", NON_NEGATIVE, "0 turns the MoE router loss off; e.g. 0.001"),
    ("algo.rollout_correction_cap", Bound(1, None, low_open=True),
     "the cap on pi_trainer/pi_rollout, above 1, e.g. 2.0"),
    ("optim.lr", POSITIVE, "set the peak learning rate, e.g. 1e-6 for a 7B model or 1e-4 for a "
                           "tiny CPU one"),
    ("optim.weight_decay", NON_NEGATIVE, "0 turns weight decay off (EasyR1 uses 1e-2)"),
    ("optim.warmup_steps", NON_NEGATIVE, "0 turns warm-up off"),
    ("optim.min_lr_ratio", FRACTION, "the cosine floor as a fraction of lr, e.g. 0.1"),
    ("optim.max_grad_norm", NON_NEGATIVE, "the gradient clipping norm, e.g. 1.0; 0 turns "
                                          "clipping off"),
    ("train.dynamic_max_draws", NON_NEGATIVE, "extra prompt draws per step for "
                                               "dynamic_sampling, e.g. 3"),
    ("train.steps", AT_LEAST_1, "a GRPO run takes at least one step, e.g. 100"),
    ("train.batch_prompts", AT_LEAST_1, "prompts per step, e.g. 8"),
    ("train.micro_batch", AT_LEAST_1,
     "sequences per forward/backward, e.g. 16 (lower saves memory)"),
    ("train.eval_every", NON_NEGATIVE, "0 evaluates at the start and end only"),
    ("train.save_every", NON_NEGATIVE, "0 saves at the end only"),
    ("train.keep_checkpoints", AT_LEAST_1,
     "keep at least the latest, which --resume continues from"),
    ("train.seed", Bound(0, 2**32 - 1), "numpy takes seeds in this range; use e.g. 0"),
    ("train.eval_samples", NON_NEGATIVE, "0 evaluates greedy completions only"),
    ("train.eval_batch", AT_LEAST_1, "held-out prompts per generate call, e.g. 32"),
    ("train.threads", NON_NEGATIVE, "0 keeps torch's default"),
    ("train.max_skipped_steps", AT_LEAST_1,
     "consecutive non-finite steps tolerated before the run stops, e.g. 3"),
    ("sft.steps", AT_LEAST_1, "SFT takes at least one step (`mmrlvr sft --pwsd-only` skips it)"),
    ("sft.batch_size", AT_LEAST_1, "examples per step, e.g. 32"),
    ("sft.lr", POSITIVE, "set the peak learning rate, e.g. 1e-5 for a 7B model or 3e-3 for a "
                         "tiny CPU one"),
    ("sft.warmup_steps", NON_NEGATIVE, "0 turns warm-up off"),
    ("sft.privileged_fraction", FRACTION, "the share of each batch shown the teacher prompt; "
                                          "0 turns it off"),
    ("sft.pwsd.steps", NON_NEGATIVE, "0 runs SFT only"),
    ("sft.pwsd.lr", POSITIVE, "set the peak learning rate, e.g. 1e-6 for a 7B model or 3e-5 for "
                              "a tiny CPU one"),
    ("sft.pwsd.alpha", NON_NEGATIVE, "the gap sharpness, e.g. 1.0"),
    ("sft.pwsd.max_rows", AT_LEAST_1, "student rollouts distilled per step, e.g. 16"),
    ("sft.pwsd.batch_prompts", AT_LEAST_1, "prompts per step, e.g. 8"),
    ("sft.pwsd.temperature", POSITIVE, "PWSD samples groups of student rollouts (0 would be "
                                       "greedy: one completion G times); use e.g. 1.0"),
]


def _get(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _as_float(value: Any) -> Any:
    """A number or numeric string as a float (YAML 1.1 reads `3e-3`, with no dot, as a string;
    `.nan`, `.inf` and 'nan' become floats here and are refused by `validate`); else `value`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:                # an int beyond any float
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    """A finite number, or a string that reads as one (YAML 1.1 leaves `1e-3` a string)."""
    value = _as_float(value)
    return _is_number(value) and math.isfinite(value)


def _spec_problems(key: str, specs: list[Any]) -> list[str]:
    """`rewards`, `eval_rewards`, `objectives`: a list of `{name, weight, ...options}`;
    `algo.shaping`, `data.prompt_transforms`: of `{name, ...options}`."""
    out = []
    example = {"objectives": "{name: pirl_consistency, weight: 0.1}",
               "algo.shaping": "{name: gapo}",
               "data.prompt_transforms": "{name: templates, templates: ['Q: {question}']}",
               }.get(key, "{name: accuracy, weight: 1.0}")
    for i, spec in enumerate(specs):
        where = f"config key '{key}[{i}]'"
        if not isinstance(spec, dict):
            out.append(f"{where} must be a mapping like {example}, got {spec!r}")
            continue
        if "name" not in spec:
            out.append(f"{where} needs a 'name', e.g. {example}")
        elif not isinstance(spec["name"], str) or not spec["name"].strip():
            out.append(f"{where}: 'name' must be a registered name or path/file.py:function, "
                       f"got {spec['name']!r}")
        if "timeout_s" in spec and not (_is_number(spec["timeout_s"]) and _finite(spec["timeout_s"])
                                        and spec["timeout_s"] > 0):
            out.append(f"config key '{key}[{i}].timeout_s' must be a positive number of seconds, "
                       f"got {spec['timeout_s']!r}: e.g. 30 (each call of the reward is stopped "
                       "after it)")
        if spec.get("isolation", "thread") not in ("thread", "process"):
            out.append(f"config key '{key}[{i}].isolation' must be 'thread' (the default) or "
                       f"'process' (a worker process of its own), got {spec['isolation']!r}")
        if "memory_mb" in spec and (spec.get("isolation") != "process"
                                    or not (_is_number(spec["memory_mb"])
                                            and 0 < spec["memory_mb"] < math.inf)):
            out.append(f"config key '{key}[{i}].memory_mb' must be a positive number of MB with "
                       f"isolation: process (it caps the reward's worker), got "
                       f"{spec['memory_mb']!r}")
        if "weight" in spec and not _finite(spec["weight"]):
            out.append(f"config key '{key}[{i}].weight' must be a finite number, got "
                       f"{spec['weight']!r}: give a weight such as 1.0 (0 logs it without "
                       "training on it)")
    return out


def _item_problems(node: Any, prefix: str = "") -> list[str]:
    """Items of every `list[str]` key and keys/values of every `dict[str, str]` key that are not
    strings (`optim.betas` and the `{name, weight}` lists have checks of their own)."""
    out = []
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value, hint, key = getattr(node, f.name), hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            out += _item_problems(value, key + ".")
        elif hint == list[str] and isinstance(value, list):
            out += [f"config key '{key}[{i}]' must be a string, got {item!r}"
                    for i, item in enumerate(value) if not isinstance(item, str)]
        elif typing.get_origin(hint) is dict and isinstance(value, dict):
            out += [f"config key '{key}' has a key {k!r} that is not a string"
                    for k in value if not isinstance(k, str)]
            if typing.get_args(hint)[1] is str:
                out += [f"config key '{key}.{k}' must be a string, got {v!r}"
                        for k, v in value.items() if not isinstance(v, str)]
    return out


def _eval_set_problems(spec: Any) -> list[str]:
    """`data.eval` as a mapping: names usable in metric names and dirs, each path a string."""
    if not isinstance(spec, dict):
        return []
    out = []
    for name, path in spec.items():
        where = f"config key 'data.eval.{name}'"
        if not isinstance(name, str) or not re.fullmatch(EVAL_SET_NAME, name):
            out.append(f"config key 'data.eval' has a set named {name!r}: name each set with "
                       f"letters, digits, '_' or '-' (quote YAML's yes/no/on/off), e.g. in, ood")
        elif name in RESERVED_EVAL_NAMES:
            out.append(f"{where}: {name!r} is taken by the first set's own metrics; choose "
                       f"another name (not one of {list(RESERVED_EVAL_NAMES)})")
        if not isinstance(path, str) or not path:
            out.append(f"{where} must be a dataset path (a JSONL file, a dir, PATH@SPLIT), "
                       f"got {path!r}")
    return out


def find_problems(cfg: Config) -> list[str]:
    """Every problem with `cfg`'s values, one line each (empty: none); `validate` raises them."""
    problems = _choice_problems(cfg) + _range_problems(cfg) + _value_problems(cfg)
    problems += _item_problems(cfg)
    problems += _eval_set_problems(cfg.data.eval)
    problems += [f"config keys {keys}: {why(cfg) if callable(why) else why}"
                 for clash, keys, why in COMBINATIONS if clash(cfg)]
    for key in ("rewards", "eval_rewards", "objectives"):
        problems += _spec_problems(key, getattr(cfg, key))
    problems += _spec_problems("algo.shaping", cfg.algo.shaping)
    problems += _spec_problems("data.prompt_transforms", cfg.data.prompt_transforms)
    problems += async_problems(cfg)
    problems += tool_problems(cfg)
    return problems


CHOICES: dict[str, tuple[str, ...]] = {
    "algo.advantage": ("grpo", "drgrpo", "rloo", "reinforce_pp"),
    "algo.loss_agg": ("token", "seq", "seq-sum-norm"),
    "algo.kl_estimator": ("k1", "k3"),
    "algo.ratio": ("token", "sequence"),
    "algo.rollout_correction": ("none", "tis", "mis"),
    "rollout.backend": ("auto", "hf", "vllm"),
    "rollout.decode": DECODES,
    "optim.schedule": ("cosine", "constant"),
    "data.on_error": ("raise", "skip"),
    "train.device": ("auto", "cpu", "cuda"),
    "model.dtype": ("auto", "float32", "bfloat16"),
    "model.param_dtype": ("float32", "bfloat16"),
    "train.strategy": ("auto", "ddp", "fsdp2"),
    "train.sampler": ("uniform", "difficulty"),
    "train.async_rollouts": ("none", "one_step_off"),
    "sft.pwsd.teacher": ("live", "frozen"),
}
"""The config keys with a fixed set of values, and the values: what the checks accept and what
the CLI's flags for the same settings offer (`mmrlvr.config.flags`)."""


def _choice_problems(cfg: Config) -> list[str]:
    return [f"config key '{key}' is {value!r}; choose one of {list(allowed)}"
            f"{value_hint(key, value)}"
            for key, allowed in CHOICES.items() if (value := _get(cfg, key)) not in allowed]


def _range_problems(cfg: Config) -> list[str]:
    problems = []
    for key, bound, hint in RANGES:
        value = _get(cfg, key)
        if not _is_number(value):
            problems.append(f"config key '{key}' must be a number {bound}, got {value!r}: {hint}")
        elif not bound.holds(value):
            kind = "a finite number " if isinstance(value, float) else ""
            problems.append(f"config key '{key}' must be {kind}{bound}, got {value!r}: {hint}")
    for key in ("optim.lr", "sft.lr", "sft.pwsd.lr"):
        value = _get(cfg, key)
        if _is_number(value) and math.isfinite(value) and value > MAX_LR:
            problems.append(f"config key '{key}' is {value!r}, above {MAX_LR:g}: an AdamW step "
                            "moves each weight by about lr, so the weights blow up (lr 1e30 once "
                            "trained to weights of 2e29, checkpointed as complete); use e.g. "
                            "1e-6 for a 7B model or 1e-4 for a tiny CPU one")
    return problems


def _value_problems(cfg: Config) -> list[str]:
    """Values wrong in themselves or against a sibling key."""
    problems = []
    m = cfg.model
    if all(_is_number(v) and v >= 1 for v in (m.min_pixels, m.max_pixels)) \
            and m.min_pixels > m.max_pixels:
        problems.append(f"config key 'model.min_pixels' ({m.min_pixels}) must be <= "
                        f"model.max_pixels ({m.max_pixels}): raise max_pixels or lower min_pixels")
    frames = cfg.data.max_frames
    if _is_number(frames) and frames >= 2 and frames % 2:
        problems.append(f"config key 'data.max_frames' must be an even number, got {frames!r}: "
                        f"Qwen-VL merges frames in pairs; use {int(frames) - 1} or {int(frames) + 1}")
    if cfg.sft.pwsd.steps > 0 and cfg.sft.pwsd.group_size < 2:
        problems.append(f"config key 'sft.pwsd.group_size' must be >= 2, got "
                        f"{cfg.sft.pwsd.group_size!r}: PWSD compares a group of student samples")
    betas = cfg.optim.betas
    if not (isinstance(betas, list) and len(betas) == 2
            and all(_is_number(b) and Bound(0, 1, high_open=True).holds(b) for b in betas)):
        problems.append(f"config key 'optim.betas' must be two numbers in [0, 1), got {betas!r}: "
                        "AdamW's (beta1, beta2), e.g. [0.9, 0.999]")
    for i, name in enumerate(cfg.train.report_to):
        if isinstance(name, str) and name not in TRACKERS:
            problems.append(f"config key 'train.report_to[{i}]' is {name!r}; choose from "
                            f"{list(TRACKERS)} (an empty list: metrics.jsonl only)")
    fmt = cfg.data.format_prompt
    if isinstance(fmt, str) and (fmt_problem := check_format_prompt(fmt)):
        # e.g. an EasyR1 .jinja file that is not there: said before any model loads
        problems.append(fmt_problem.replace("data.format_prompt:", "config key 'data.format_prompt':", 1))
    for t in cfg.data.templates:
        if isinstance(t, str) and "{question}" not in t:
            problems.append(f"config key 'data.templates': {t!r} has no {{question}} slot; "
                            "write the template around {question}")
    if cfg.model.freeze_language and cfg.model.lora.r > 0:
        problems.append("config key 'model.freeze_language' is true with model.lora.r > 0: LoRA "
                        "trains adapters on the language model; to train the towers alone, set "
                        "model.lora.r: 0")
    if cfg.model.freeze_language and cfg.model.modality == "text":
        problems.append("config key 'model.freeze_language' is true on a text model "
                        "(model.modality: text): it would leave nothing to train")
    if cfg.model.lora.r > 0 and not cfg.model.lora.target_modules:
        problems.append("config key 'model.lora.target_modules' is empty but model.lora.r > 0: "
                        "name the modules LoRA adapts, e.g. [q_proj, k_proj, v_proj, o_proj]")
    if not cfg.rewards:
        problems.append("config key 'rewards' is empty: GRPO needs at least one reward, e.g. "
                        "[{name: accuracy, weight: 0.9}, {name: format, weight: 0.1}]")
    out_dir = cfg.train.out_dir
    if isinstance(out_dir, str) and out_dir and Path(out_dir).expanduser().is_file():
        problems.append(f"config key 'train.out_dir' is {out_dir!r}, which is a file: give a "
                        "directory for the run (it is created if missing)")
    return problems


COMBINATIONS = (
    (lambda c: _is_number(c.algo.router_aux_coef) and c.algo.router_aux_coef > 0
     and c.train.packing, "'algo.router_aux_coef' and 'train.packing'",
     "the packed forward returns no router loss; turn one off"),
    (lambda c: c.train.packing and c.train.length_buckets,
     "'train.packing' and 'train.length_buckets'", "both are true: pick one (packing runs no "
     "completion padding; buckets would split its groups)"),
    (lambda c: c.train.packing and c.model.attn_implementation not in PACKING_ATTENTION,
     "'train.packing' and 'model.attn_implementation'",
     lambda c: f"'train.packing' needs model.attn_implementation {' or '.join(PACKING_ATTENTION)} "
     f"(its block mask is 4-D), not {c.model.attn_implementation!r}"),
)
"""Options that do not run together: (clash, the keys, why and what to do, or a function of the
config that says it). `ASYNC_EXCLUDES` below holds what one-step-off rollouts do not run with."""

ASYNC_EXCLUDES = (
    (lambda c: c.rollout.backend == "vllm", "rollout.backend vllm (its engine holds its own "
     "weights; use hf)"),
    (lambda c: isinstance(c.rollout.branching, dict) and c.rollout.branching.get("kind", "none")
     != "none", "rollout.branching (its hooks sit on the trained "
     "model, not on the behaviour copy)"),
    (lambda c: c.train.dynamic_sampling, "train.dynamic_sampling (it draws again after scoring, "
     "which a batch generated ahead cannot)"),
)
"""What `train.async_rollouts: one_step_off` (mmrlvr/train/async_rollout.py) does not run with."""


def async_problems(cfg: Config) -> list[str]:
    if cfg.train.async_rollouts != "one_step_off":
        return []
    return [f"config key 'train.async_rollouts' one_step_off does not run with {why}"
            for clash, why in ASYNC_EXCLUDES if clash(cfg)]


def validate(cfg: Config) -> None:
    """Raise one ConfigError listing every problem `find_problems` finds: values that would
    otherwise crash the run after the model loads, or quietly make it do something else."""
    _raise(find_problems(cfg))


# --- the model --------------------------------------------------------------------------------


def missing_model_message(path: str, reason: str) -> str:
    """What to say about a `model.path` that is neither a local dir nor a loadable hub id."""
    return (f"model.path {path!r}: no such local dir, and not in the local Hugging Face cache "
            f"({reason}); give a model dir (e.g. from `mmrlvr tiny`) or a cached hub id")


def check_model_path(path: str) -> None:
    """Raise ConfigError unless `path` is a local model dir (with config.json) or a hub id this
    machine can load: in the local HF cache, or, when online, well-formed for a download.

    Cheap (no network, no weights): a trainer calls it at start. `validate` does not, since an
    earlier stage (SFT, PWSD) may legitimately create the dir after the config is read."""
    if not path:
        raise ConfigError("model.path is empty: give a local model dir or hub id")
    local = Path(path)
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"model.path {path!r} is a dir without config.json, so not a model "
                              "dir (a run dir keeps its models in final/ and checkpoints/step-N/)")
        return
    if local.exists():
        raise ConfigError(f"model.path {path!r} is a file; give a model dir or hub id")
    import huggingface_hub
    from huggingface_hub.utils import HFValidationError

    offline = huggingface_hub.is_offline_mode()
    try:
        cached = huggingface_hub.try_to_load_from_cache(path, "config.json")
    except (HFValidationError, ValueError):            # not of the form org/name
        why = "offline" if offline else "and not a hub id, which looks like org/name"
        raise ConfigError(missing_model_message(path, why)) from None
    if isinstance(cached, str):
        return
    if offline:
        raise ConfigError(missing_model_message(path, "offline"))
