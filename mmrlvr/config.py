"""Run configuration: YAML onto typed dataclasses, dotted overrides, loud unknown keys.

Every field carries a one-line docstring (shown by `mmrlvr train --help-config`). Defaults are
the values METHODS.md gives. Unknown keys are errors that name the key and the nearest known one.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key."""


@dataclass
class LoraConfig:
    r: int = 0
    """LoRA rank; 0 trains the full model."""
    alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names (in the language model) that get LoRA adapters."""


@dataclass
class ModelConfig:
    path: str = ""
    """Local model dir or hub id (anything AutoProcessor and the model's auto class load)."""
    modality: str = "vision"
    """Modality adapter name (`modalities.get`)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA through peft; `r: 0` disables it."""
    dtype: str = "auto"
    """Compute dtype: `auto` (bf16 on CUDA, fp32 on CPU), `float32` or `bfloat16` (weights stay fp32)."""
    param_dtype: str = "float32"
    """Dtype of trainable weights and optimiser state; `bfloat16` (pure bf16) rounds small updates away."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    freeze_vision: bool = False
    """Keep the vision tower's weights fixed."""
    freeze_audio: bool = False
    """Keep the audio encoder's weights fixed (the projector still trains; AudioRubrics does)."""
    min_pixels: int = 56 * 56
    """Smallest image area after resizing (qwen-vl-utils `min_pixels`)."""
    max_pixels: int = 112 * 112
    """Largest image area after resizing (qwen-vl-utils `max_pixels`)."""
    attn_implementation: str = "sdpa"
    """Attention kernel: `sdpa`, `eager` or `flash_attention_2` (GPU)."""


@dataclass
class DataConfig:
    train: str = ""
    """Training set: a JSONL file, or `layout:file.parquet` (e.g. `geo3k:train.parquet`)."""
    eval: str = ""
    """Held-out set in the same forms; empty skips eval."""
    on_error: str = "raise"
    """Bad rows: `raise` stops with the file and row, `skip` drops and counts them."""
    eval_limit: int = 0
    """Evaluate on at most this many held-out rows (0 = all)."""
    system_prompt: str = ""
    """System message prepended to every prompt (empty: none)."""
    format_prompt: str = ""
    """Instruction appended to each question, e.g. asking for <think>/<answer> tags."""
    templates: list[str] = field(default_factory=list)
    """Prompt templates with a `{question}` slot; each prompt gets one drawn per step (empty: off)."""
    allow_outside: bool = False
    """Allow media paths that are absolute or lead outside the data file's dir (`../`)."""
    max_image_pixels: int = 64_000_000
    """Largest image (width × height) accepted at load; bigger files are bad rows."""
    max_audio_seconds: float = 600.0
    """Longest audio clip accepted at load; longer clips are bad rows."""


@dataclass
class RolloutConfig:
    backend: str = "hf"
    """`hf` (transformers generate, CPU/GPU) or `vllm` (GPU, optional extra)."""
    group_size: int = 8
    """Completions sampled per prompt (G)."""
    max_new_tokens: int = 64
    """Longest completion."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    branching: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    """Rollout branching (NC-GRPO latent noise); `kind: none` is plain GRPO."""
    vllm_gpu_memory_utilization: float = 0.5
    """vLLM backend: fraction of GPU memory for its KV cache."""


@dataclass
class AlgoConfig:
    advantage: str = "grpo"
    """`grpo` ((r-mean)/(std+eps)) or `drgrpo` (r-mean, no std)."""
    loss_agg: str = "token"
    """`token` (mean over all tokens), `seq` (mean of per-sequence means), `seq-sum-norm` (Dr.GRPO)."""
    beta: float = 0.0
    """KL coefficient to a frozen reference; 0 loads no reference."""
    kl_estimator: str = "k3"
    """`k1` or `k3` (Schulman's unbiased, non-negative estimator)."""
    clip_low: float = 0.2
    """Lower PPO clip epsilon."""
    clip_high: float = 0.28
    """Upper PPO clip epsilon (DAPO clip-higher)."""
    ppo_epochs: int = 1
    """Optimisation passes over each batch of rollouts."""
    eps: float = 1e-6
    """Added to the group std in the GRPO advantage."""
    norm_len: int = 0
    """Token budget for `seq-sum-norm` (0 = rollout.max_new_tokens)."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    schedule: str = "cosine"
    """`cosine` decay to `min_lr_ratio`·lr after warm-up, or `constant`."""
    min_lr_ratio: float = 0.1
    """Floor of the cosine schedule as a fraction of lr."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 = off)."""


@dataclass
class TrainConfig:
    steps: int = 100
    """GRPO steps (each: rollouts for `batch_prompts` prompts, then the update)."""
    batch_prompts: int = 8
    """Prompts per step (B); each gets `rollout.group_size` completions."""
    micro_batch: int = 16
    """Sequences per forward/backward; gradients accumulate over micro-batches."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at start and end, where eval data is set)."""
    save_every: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""
    seed: int = 0
    """Seed for data order, sampling and init."""
    out_dir: str = "runs/default"
    """The run dir: config, metrics, checkpoints, report."""
    device: str = "auto"
    """`auto` (CUDA when present, else CPU), `cpu` or `cuda`."""
    eval_samples: int = 0
    """Extra sampled completions per held-out prompt for pass@k (0 = greedy only)."""
    eval_reward: bool = False
    """Also report eval/reward(/<part>): the configured rewards (a fresh copy) on greedy completions."""
    eval_batch: int = 32
    """Held-out prompts per generate call."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    max_skipped_steps: int = 3
    """Stop the run after this many consecutive steps skipped for a non-finite loss or gradient."""
    check_memory: bool = True
    """On GPU, refuse a run that `mmrlvr plan` says will not fit (false: warn and run it)."""
    strategy: str = "auto"
    """Multi-process engine: `auto` (DDP when the model fits one device by `mmrlvr plan`, else FSDP2), `ddp`, `fsdp2`."""


@dataclass
class PWSDStageConfig:
    """The PWSD stage `mmrlvr sft` runs after SFT (TransAnyText): on-policy self-distillation
    from the privileged teacher, no policy-gradient term (the rewards are weighted 0 and only
    logged)."""

    steps: int = 0
    """PWSD steps (0: SFT only)."""
    lr: float = 1e-4
    """Peak learning rate."""
    alpha: float = 1.0
    """Gap sharpness in w_t = σ(α·gap_t) (METHODS.md)."""
    max_rows: int = 16
    """Student rollouts distilled per step."""
    teacher: str = "live"
    """`live`: the model being trained scores as teacher; `frozen`: the SFT weights PWSD started from."""
    batch_prompts: int = 8
    """Prompts per step."""
    group_size: int = 2
    """Student samples per prompt."""
    temperature: float = 1.0
    """Sampling temperature of the student's rollouts (GRPO's is rollout.temperature)."""
    out_dir: str = "runs/pwsd"
    """Where the PWSD model and its run go (`OUT/final` is what GRPO starts from and keeps a KL to)."""


@dataclass
class SFTConfig:
    init: str = ""
    """Model to start the warm start from (empty: `model.path`)."""
    steps: int = 200
    """Supervised steps."""
    batch_size: int = 32
    """Examples per step."""
    lr: float = 1e-3
    """Peak learning rate."""
    warmup_steps: int = 10
    """Linear warm-up steps."""
    out_dir: str = "runs/sft"
    """Where the warm-started model and its log go."""
    privileged_fraction: float = 0.0
    """Share of each batch shown the privileged teacher prompt (image_translation; for PWSD)."""
    pwsd: PWSDStageConfig = field(default_factory=PWSDStageConfig)
    """Optional PWSD stage after SFT."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy."""
    data: DataConfig = field(default_factory=DataConfig)
    """Datasets."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling."""
    rewards: list[dict[str, Any]] = field(default_factory=lambda: [
        {"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1}])
    """Rewards as `{name, weight, ...options}`; `name` may be `path/file.py:function`."""
    eval_rewards: list[dict[str, Any]] = field(default_factory=list)
    """Rewards `train.eval_reward` scores eval's greedy completions with (empty: `rewards`)."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """GRPO algorithm."""
    objectives: list[dict[str, Any]] = field(default_factory=list)
    """Auxiliary objectives as `{name, weight, ...options}` (empty: plain GRPO)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser and schedule."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Loop, logging and checkpoints."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised warm start (`mmrlvr sft`)."""


def _from_dict(cls: type, data: Any, prefix: str, problems: list[str]) -> Any:
    """`cls` built from `data`; every unknown key and mistyped value is added to `problems`
    (the field keeps its default) so that one error can list them all."""
    if data is None:                         # `optim:` with nothing under it
        data = {}
    if not isinstance(data, dict):
        problems.append(f"config key '{prefix.rstrip('.') or '<root>'}' must be a mapping, "
                        f"got {data!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{prefix}{near[0]}'?)" if near else ""
            problems.append(f"unknown config key '{dotted}'{hint}; known: {sorted(names)}")
            continue
        try:
            kwargs[key] = _coerce(hints[key], value, dotted, problems)
        except ConfigError as err:
            problems.append(str(err))
    return cls(**kwargs)


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


def _coerce(hint: Any, value: Any, dotted: str, problems: list[str]) -> Any:
    if dataclasses.is_dataclass(hint):
        return _from_dict(hint, value, dotted + ".", problems)
    origin = typing.get_origin(hint)
    if hint is float:
        value = _as_float(value)
    if hint in (int, float, str, bool) and type(value) is not hint:  # bool is an int subclass
        raise ConfigError(f"config key '{dotted}' must be {hint.__name__}, got {value!r}")
    if origin is list and not isinstance(value, list):
        raise ConfigError(f"config key '{dotted}' must be a list, got {value!r}")
    if origin is list and typing.get_args(hint) == (float,):
        value = [_as_float(v) for v in value]
    if origin is dict and not isinstance(value, dict):
        raise ConfigError(f"config key '{dotted}' must be a mapping, got {value!r}")
    return value


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# --- YAML: plain values only ------------------------------------------------------------------

class _Loader(yaml.SafeLoader):
    """`yaml.SafeLoader` (no tag builds an object) that also refuses a key given twice in one
    mapping, which YAML would resolve silently to the last (a second `optim:` section would
    drop the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[str, yaml.Mark] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    problem=f"duplicate key '{key_node.value}' (first given at line "
                            f"{seen[key_node.value].line + 1}); keep one",
                    problem_mark=key_node.start_mark)
            seen[key_node.value] = key_node.start_mark
        return super().construct_mapping(node, deep)


def _yaml_error(err: yaml.YAMLError, where: str, of_value: bool = False) -> str:
    """One line for a YAML error: `where`, the position, the parser's problem."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if mark is None:
        at = ""
    elif of_value:
        at = f" at column {mark.column + 1} of its value"
    else:
        at = f" at line {mark.line + 1}, column {mark.column + 1}"
    tag = re.search(r"constructor for the tag '([^']*)'", problem)
    if tag:
        name = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        line = f" at line {mark.line + 1}" if mark is not None and not of_value else ""
        return (f"{where}: unsafe/unknown YAML tag {name}{line}; mmrlvr configs hold plain values "
                f"only (numbers, strings, lists, mappings): remove the tag")
    if isinstance(err, yaml.constructor.ConstructorError):         # e.g. a duplicate key
        return f"{where}: YAML error{at}: {problem}"
    context, cmark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and cmark is not None and not of_value:
        problem += f" ({context} begun at line {cmark.line + 1}, column {cmark.column + 1})"
    elif context:
        problem += f" ({context})"
    if "'\\t'" in problem:
        problem += "; YAML indents with spaces, not tabs"
    elif "block end" in problem or "mapping values are not allowed" in problem:
        problem += "; check the indentation there, and quote values that hold ': '"
    if of_value:
        problem += "; quote the value if it is text"
    return f"{where}: YAML syntax error{at}: {problem}"


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); a config "
                          "is a YAML text file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config ({err.strerror})") from None
    try:
        return yaml.load(text, Loader=_Loader)      # a SafeLoader: no tag builds an object
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error(err, str(path))) from None


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply `a.b.c=value` (value parsed as YAML) to a nested dict in place."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.sub=value")
    key, _, text = override.partition("=")
    try:
        value = yaml.load(text, Loader=_Loader) if text != "" else ""
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error(err, f"override {override!r}", of_value=True)) from None
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        if node.get(part) is None:           # absent, or `optim:` with nothing under it
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(f"override {override!r}: '{part}' is not a section")
    node[parts[-1]] = value


def _raise(problems: list[str]) -> None:
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems in the config (fix them all, then rerun):\n"
                          + "\n".join(f"  - {p}" for p in problems))


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a YAML config (or start from defaults), apply dotted overrides, validate.

    Every problem found (unknown keys, wrong types, values out of range) is reported in one
    ConfigError, one line each."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        raw = _read_yaml(path) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    problems: list[str] = []
    for ov in overrides:
        try:
            apply_override(raw, ov)
        except ConfigError as err:
            problems.append(str(err))
    cfg = _from_dict(Config, raw, "", problems)
    _raise(problems + find_problems(cfg))
    return cfg


# --- values -----------------------------------------------------------------------------------

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

GREEDY_HINT = ("0 means greedy decoding, but GRPO needs sampled groups: a greedy group is G "
               "copies of one completion, so every advantage is 0 and nothing is learnt; "
               "use e.g. 0.7–1.0")

RANGES: list[tuple[str, Bound, str]] = [
    # (key, allowed values, what to do): every numeric key whose bad value would crash the run
    # after the model loads, or quietly do something other than asked
    ("model.lora.r", NON_NEGATIVE, "the LoRA rank, e.g. 8; 0 trains the full model"),
    ("model.lora.alpha", AT_LEAST_1, "the LoRA scale numerator, e.g. 2·r"),
    ("model.lora.dropout", Bound(0, 1, high_open=True), "e.g. 0.0 or 0.05"),
    ("model.min_pixels", AT_LEAST_1, "the smallest image area after resizing, e.g. 3136 (56·56)"),
    ("model.max_pixels", AT_LEAST_1,
     "the largest image area after resizing, e.g. 12544 (112·112) for a tiny model"),
    ("data.eval_limit", NON_NEGATIVE, "0 evaluates every held-out row"),
    ("data.max_image_pixels", AT_LEAST_1,
     "the largest image (width × height) accepted, e.g. 64000000"),
    ("data.max_audio_seconds", POSITIVE, "the longest audio clip accepted, e.g. 600"),
    ("rollout.group_size", Bound(2), "GRPO compares the completions of a group; use e.g. 4–16"),
    ("rollout.max_new_tokens", AT_LEAST_1, "the longest completion in tokens, e.g. 64 (tiny CPU "
                                           "model) to 1024 or more (long reasoning)"),
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
    ("optim.lr", POSITIVE, "set the peak learning rate, e.g. 1e-6 for a 7B model or 1e-4 for a "
                           "tiny CPU one"),
    ("optim.weight_decay", NON_NEGATIVE, "0 turns weight decay off (EasyR1 uses 1e-2)"),
    ("optim.warmup_steps", NON_NEGATIVE, "0 turns warm-up off"),
    ("optim.min_lr_ratio", FRACTION, "the cosine floor as a fraction of lr, e.g. 0.1"),
    ("optim.max_grad_norm", NON_NEGATIVE, "the gradient clipping norm, e.g. 1.0; 0 turns "
                                          "clipping off"),
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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    """A finite number, or a string that reads as one (YAML 1.1 leaves `1e-3` a string)."""
    value = _as_float(value)
    return _is_number(value) and math.isfinite(value)


def _spec_problems(key: str, specs: list[Any]) -> list[str]:
    """`rewards`, `eval_rewards`, `objectives`: a list of `{name, weight, ...options}`."""
    out = []
    example = "{name: pirl_consistency, weight: 0.1}" if key == "objectives" else \
        "{name: accuracy, weight: 1.0}"
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
        if "weight" in spec and not _finite(spec["weight"]):
            out.append(f"config key '{key}[{i}].weight' must be a finite number, got "
                       f"{spec['weight']!r}: give a weight such as 1.0 (0 logs it without "
                       "training on it)")
    return out


def find_problems(cfg: Config) -> list[str]:
    """Every problem with `cfg`'s values, one line each (empty: none); `validate` raises them."""
    problems = []
    choices = {
        "algo.advantage": (cfg.algo.advantage, ("grpo", "drgrpo")),
        "algo.loss_agg": (cfg.algo.loss_agg, ("token", "seq", "seq-sum-norm")),
        "algo.kl_estimator": (cfg.algo.kl_estimator, ("k1", "k3")),
        "rollout.backend": (cfg.rollout.backend, ("hf", "vllm")),
        "optim.schedule": (cfg.optim.schedule, ("cosine", "constant")),
        "data.on_error": (cfg.data.on_error, ("raise", "skip")),
        "train.device": (cfg.train.device, ("auto", "cpu", "cuda")),
        "model.dtype": (cfg.model.dtype, ("auto", "float32", "bfloat16")),
        "model.param_dtype": (cfg.model.param_dtype, ("float32", "bfloat16")),
        "train.strategy": (cfg.train.strategy, ("auto", "ddp", "fsdp2")),
        "sft.pwsd.teacher": (cfg.sft.pwsd.teacher, ("live", "frozen")),
    }
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            problems.append(f"config key '{key}' is {value!r}; choose one of {list(allowed)}")

    for key, bound, hint in RANGES:
        value = _get(cfg, key)
        if not _is_number(value):
            problems.append(f"config key '{key}' must be a number {bound}, got {value!r}: {hint}")
        elif not bound.holds(value):
            kind = "a finite number " if isinstance(value, float) else ""
            problems.append(f"config key '{key}' must be {kind}{bound}, got {value!r}: {hint}")
    m = cfg.model
    if all(_is_number(v) and v >= 1 for v in (m.min_pixels, m.max_pixels)) \
            and m.min_pixels > m.max_pixels:
        problems.append(f"config key 'model.min_pixels' ({m.min_pixels}) must be <= "
                        f"model.max_pixels ({m.max_pixels}): raise max_pixels or lower min_pixels")
    if cfg.sft.pwsd.steps > 0 and cfg.sft.pwsd.group_size < 2:
        problems.append(f"config key 'sft.pwsd.group_size' must be >= 2, got "
                        f"{cfg.sft.pwsd.group_size!r}: PWSD compares a group of student samples")

    betas = cfg.optim.betas
    if not (isinstance(betas, list) and len(betas) == 2
            and all(_is_number(b) and Bound(0, 1, high_open=True).holds(b) for b in betas)):
        problems.append(f"config key 'optim.betas' must be two numbers in [0, 1), got {betas!r}: "
                        "AdamW's (beta1, beta2), e.g. [0.9, 0.999]")
    for key, items in (("data.templates", cfg.data.templates),
                       ("model.lora.target_modules", cfg.model.lora.target_modules)):
        for i, item in enumerate(items):
            if not isinstance(item, str):
                problems.append(f"config key '{key}[{i}]' must be a string, got {item!r}")
    for t in cfg.data.templates:
        if isinstance(t, str) and "{question}" not in t:
            problems.append(f"config key 'data.templates': {t!r} has no {{question}} slot; "
                            "write the template around {question}")
    if cfg.model.lora.r > 0 and not cfg.model.lora.target_modules:
        problems.append("config key 'model.lora.target_modules' is empty but model.lora.r > 0: "
                        "name the modules LoRA adapts, e.g. [q_proj, k_proj, v_proj, o_proj]")
    for key in ("rewards", "eval_rewards", "objectives"):
        problems += _spec_problems(key, getattr(cfg, key))
    return problems


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


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, docstring) for every field, read from the source docstrings."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) \
                and isinstance(getattr(nxt, "value", None), ast.Constant):
            docs[node.target.id] = str(nxt.value.value)
    rows = []
    default = cls()
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            rows.extend(describe(hint, f"{prefix}{f.name}."))
        else:
            rows.append((f"{prefix}{f.name}", repr(getattr(default, f.name)), docs.get(f.name, "")))
    return rows
