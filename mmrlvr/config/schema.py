"""Every config key: typed dataclasses whose fields carry a one-line docstring (shown by
`mmrlvr train --help-config`, read back by `describe`). Defaults are the values docs/methods.md gives."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key."""


TRACKERS: tuple[str, ...] = ("tensorboard", "wandb", "mlflow", "trackio")
"""What `train.report_to` may name (accelerate's trackers of these names)."""


@dataclass
class LoraConfig:
    r: int = 0
    """LoRA rank; 0 trains the full model."""
    alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names (in the language model) that get LoRA adapters; `[auto]`: the model family's."""


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
    freeze_language: bool = False
    """Keep the language model's weights fixed (decoder, embeddings, LM head) and train the towers and connector alone: a new tower's alignment stage."""
    min_pixels: int = 0
    """Smallest image area after resizing (qwen-vl-utils `min_pixels`; 0: the model processor's)."""
    max_pixels: int = 0
    """Largest image area after resizing (qwen-vl-utils `max_pixels`; 0: the model processor's)."""
    attn_implementation: str = "sdpa"
    """Attention kernel: `sdpa`, `eager` or `flash_attention_2` (GPU)."""


@dataclass
class DataConfig:
    train: str = ""
    """Training set: JSONL/JSON/parquet/arrow file, a save_to_disk or shard dir, `PATH@SPLIT`, or `layout:PATH`."""
    eval: str | dict[str, str] = ""
    """Held-out set in the same forms, or several as {name: path} (the first logs eval/..., the others eval/<name>/...); empty skips eval."""
    on_error: str = "raise"
    """Bad rows: `raise` stops with the file and row, `skip` drops and counts them."""
    eval_limit: int = 0
    """Evaluate on at most this many held-out rows (0 = all)."""
    system_prompt: str = ""
    """System message prepended to every prompt (empty: none)."""
    format_prompt: str = ""
    """Instruction appended to each question (e.g. asking for <think>/<answer> tags), or a Jinja template rendered with the question as `content`: a `.jinja` file (EasyR1's format_prompt) or text holding `{{ }}`."""
    templates: list[str] = field(default_factory=list)
    """Prompt templates with a `{question}` slot; each prompt gets one drawn per step (empty: off)."""
    prompt_transforms: list[dict[str, Any]] = field(default_factory=list)
    """Prompt transforms for each step's prompts, after `templates`: `{name, ...options}` each (the prompt-transform hook, `mmrlvr.core.prompting`; eval prompts are never transformed)."""
    allow_outside: bool = False
    """Allow media paths that are absolute or lead outside the data file's dir (`../`)."""
    max_image_pixels: int = 64_000_000
    """Largest image (width × height) accepted at load; bigger files are bad rows."""
    max_audio_seconds: float = 600.0
    """Longest audio clip accepted at load; longer clips are bad rows."""
    max_video_seconds: float = 600.0
    """Longest video accepted at load (by its header); longer videos are bad rows."""
    video_fps: float = 2.0
    """Frames sampled per second of video (qwen-vl-utils' fps)."""
    max_frames: int = 16
    """Most frames sampled from one video (an even number; longer videos are sampled sparser)."""
    max_video_pixels: int = 0
    """Largest frame area after resizing (0: model.max_pixels)."""
    max_prompt_tokens: int = 0
    """Longest prompt in tokens (text, system/format prompts and media) a row may have; longer rows are bad rows (0: only the model's context bounds it)."""
    columns: dict[str, str] = field(default_factory=dict)
    """Column of each Example field, e.g. {prompt: problem, answer: solution, images: image} (empty: detect TRL/EasyR1/ms-swift layouts)."""


@dataclass
class RolloutConfig:
    backend: str = "auto"
    """`auto` (vLLM on a GPU where it is installed, else hf), `hf` (transformers generate) or `vllm`."""
    group_size: int = 8
    """Completions sampled per prompt (G)."""
    max_new_tokens: int = 0
    """Longest completion in tokens (0: the model's generation_config `max_new_tokens`, else 1024)."""
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
    decode: str = "eager"
    """hf backend: `eager` (dynamic KV cache), `static` or `compiled` (static cache + CUDA graphs)."""
    max_turns: int = 1
    """Policy turns per rollout; above 1 a turn ending in a `<tool_call>` runs a tool of `tools` and the policy continues (docs/tools.md). 1: single-turn."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Tools the policy may call, as `{name, timeout_s?, label?, ...options}`: built-in `zoom`, `clip`, or `file.py:function` (empty: no tools, single-turn)."""
    max_trajectory_tokens: int = 0
    """Most tokens after the prompt in a multi-turn rollout, tool turns included (0: max_turns × max_new_tokens)."""


@dataclass
class AlgoConfig:
    advantage: str = "grpo"
    """`grpo` ((r-mean)/(std+eps)), `drgrpo` (r-mean, no std), `rloo` (leave-one-out mean) or `reinforce_pp` (group mean, one std over the step)."""
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
    ratio: str = "token"
    """Importance ratio: `token` (PPO/GRPO) or `sequence` (GSPO; with loss_agg seq, clips ~3e-4/4e-4)."""
    ppo_epochs: int = 1
    """Optimisation passes over each batch of rollouts."""
    eps: float = 1e-6
    """Added to the group std in the GRPO advantage."""
    norm_len: int = 0
    """Token budget for `seq-sum-norm` (0 = rollout.max_new_tokens)."""
    router_aux_coef: float = 0.0
    """MoE families: weight of the router load-balancing loss added to the update (0: off; Qwen3-VL-MoE's own config uses 0.001)."""
    mask_truncated: bool = False
    """Completions cut by rollout.max_new_tokens (no EOS) get advantage 0: no policy gradient (DAPO's overlong filtering)."""
    rollout_correction: str = "none"
    """`tis` (truncated importance sampling: each token's loss times min(π_trainer/π_rollout, cap)), `mis` (tokens whose ratio passes the cap get no loss) or `none`."""
    rollout_correction_cap: float = 2.0
    """The cap of `rollout_correction` on π_trainer/π_rollout (MIS also drops ratios below 1/cap)."""
    shaping: list[dict[str, Any]] = field(default_factory=list)
    """Token-level credit plug-ins as `{name, ...options}`: gapo, cue_grpo, gmts (empty: plain GRPO)."""


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
    length_buckets: bool = False
    """Fill micro-batches with completions of similar length (less padding; float sums reorder)."""
    packing: bool = False
    """Pack each group's completions after one copy of its prompt under a block mask: no completion padding (sdpa/eager; docs/grpo-step.md)."""
    dynamic_sampling: bool = False
    """Train only groups whose rewards have spread: draw more prompts while a step has fewer than batch_prompts of them (DAPO; docs/grpo-step.md)."""
    dynamic_max_draws: int = 3
    """Extra draws a step may make for dynamic_sampling; still short after them, it fills with zero-spread groups."""
    async_rollouts: str = "none"
    """one_step_off: generate the next step's rollouts on a thread while this step updates, from a copy of the weights before the update (one step stale; the ratio is taken against them; docs/grpo-step.md)."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at start and end, where eval data is set)."""
    save_every: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""
    seed: int = 0
    """Seed for data order, sampling and init."""
    sampler: str = "uniform"
    """Prompt order: `uniform` (seeded permutations) or `difficulty` (docs/difficulty_sampling.md)."""
    sampler_options: dict[str, Any] = field(default_factory=dict)
    """Options of the `difficulty` sampler (states, coupling, neighbours, floor, temperature, decay, ...)."""
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
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Trackers: any of tensorboard, wandb, mlflow, trackio (a missing one warns; metrics.jsonl is always written)."""
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
    """Gap sharpness in w_t = σ(α·gap_t) (docs/methods.md)."""
    max_rows: int = 16
    """Student rollouts distilled per step."""
    teacher: str = "live"
    """`live`: the model being trained scores as teacher; `frozen`: the SFT weights PWSD started from."""
    dash: dict[str, Any] | None = None
    """DASH options for the pwsd objective, e.g. `{gamma: 0.9}` (docs/dash.md); None: off."""
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
class OPDStageConfig:
    """On-policy distillation before GRPO (`mmrlvr opd CONFIG`, docs/opd.md): the student samples,
    the teacher's per-token reverse KL on those tokens is the loss (rewards weighted 0, logged);
    the held-out score every `eval_every` steps decides when GRPO takes over, from the best
    checkpoint."""

    teacher: str = ""
    """Teacher model dir with the policy's tokenizer (required by `mmrlvr opd`)."""
    steps: int = 200
    """Most OPD steps; the switch rule may stop sooner."""
    eval_every: int = 10
    """Held-out eval (and a checkpoint) every N OPD steps; the switch is decided there."""
    metric: str = "eval/accuracy"
    """The validation score the switch reads (a metric of the eval rows, e.g. `eval/reward`)."""
    patience: int = 2
    """Switch after this many evals in a row without a gain over the best score (> min_delta)."""
    min_delta: float = 0.0
    """A gain smaller than this is no gain."""
    threshold: float | None = None
    """Switch as soon as the score reaches this (None: only patience and steps end OPD)."""
    estimator: str = "sampled"
    """`sampled`: log π_S − log π_T of the sampled token (policy-gradient form); `full`: exact KL over the vocabulary per position."""
    max_rows: int = 64
    """Student rollouts distilled per step (bounds the [n, C, V] logits)."""
    lr: float = 0.0
    """Peak learning rate of the OPD stage (0: optim.lr)."""
    batch_prompts: int = 0
    """Prompts per OPD step (0: train.batch_prompts)."""
    group_size: int = 2
    """Student samples per prompt (>= 2: the trainer's groups)."""
    temperature: float = 1.0
    """Student sampling temperature (1: the reverse KL is of the model as it is)."""
    out_dir: str = "runs/opd"
    """The OPD stage's run dir; GRPO's is train.out_dir."""


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
    opd: OPDStageConfig = field(default_factory=OPDStageConfig)
    """On-policy distillation before GRPO (`mmrlvr opd`)."""
    plugins: list[str] = field(default_factory=list)
    """Your plug-in packages (docs/extending.md), imported as the config loads: module names or paths."""


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


DECODES = ("eager", "static", "compiled")
"""`rollout.decode` choices (the hf engine checks them too: benches and tests build it directly)."""
PACKING_ATTENTION = ("sdpa", "eager")
"""`model.attn_implementation`s `train.packing` works with (they take its 4-D block mask)."""
EVAL_SET_NAME = r"[A-Za-z0-9_-]+"
"""What a `data.eval` set name may hold: it names metrics (`eval/<name>/...`) and a dir."""
RESERVED_EVAL_NAMES = ("eval", "family", "answer_type", "reward")
"""Set names that would collide with the first set's own metric or record names."""


def eval_sets(spec: str | dict[str, str]) -> list[tuple[str, str]]:
    """`data.eval` as an ordered list of (name, path): one path is one set named `eval`; a
    mapping keeps its order (the first set is the one whose metrics keep today's names)."""
    if isinstance(spec, dict):
        return [(str(name), path) for name, path in spec.items()]
    return [("eval", spec)] if spec else []
