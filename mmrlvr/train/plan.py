"""`mmrlvr plan`: per-GPU memory of a run config under DDP and FSDP2, before loading any weights.

Parameter counts are exact: the model's config (a local dir, the HF cache, or for a known hub id
the published config.json dims in `BUILTIN`) is built on the meta device, as `Policy.load` builds
it (Qwen2.5-Omni: its thinker), and counted by tower with the family's freeze rules
(`mmrlvr.models`: Qwen-VL's `visual.*`, Gemma's `vision_tower.*`, `audio_tower.*`; the rest is
the language model). The rest is arithmetic. Bytes per GPU, with W
GPUs, c bytes per compute element (`model.dtype`; `auto` is bf16 on CUDA), p per
`model.param_dtype` element, and "÷W" marking what FSDP2 shards:

  trainable weights  T·p ÷W    T: all outside frozen towers; LoRA: r·(in+out) per nn.Linear whose
                               name ends in a `model.lora.target_modules` entry (peft's rule)
  frozen weights     (N-T)·p ÷W  Policy.load holds a full fine-tune in p; a LoRA base: N·c ÷W
  AdamW moments      2·T·p ÷W
  DDP buckets        T·p        ddp on 2+ GPUs: DistributedDataParallel's gradient buckets, which
                               hold the gradients themselves (gradient_as_bucket_view)
  reference model    N·c ÷W    algo.beta > 0, or a `pwsd` objective with `teacher: frozen`; never
                               with LoRA (the base with adapters off is the reference)
  gradients          T·p ÷W    update phase only (set to None between steps); ddp on 2+ GPUs: 0
  compute copies     fsdp2 (`mmrlvr.train.parallel`: a unit per layer, per block and per media tower):
                     rollout N·c, the whole model gathered around `generate`; update: the root
                     (embeddings, lm_head, kept gathered) and the two largest units, parameters
                     and their unsharded gradients. ddp: T·c when p != c (autocast's cached casts)
  KV cache (hf)      S·L·kv_layers·2·kv_heads·head_dim·c; S = batch_prompts·group_size/W, L = P+C;
                     kv_layers: layers with a KV cache (Qwen3.5: its full-attention quarter)
  prefill (hf)       S·P·(2h + 3i)·c, one decoder layer's working set, + the sampling logits
  vLLM               rollout.vllm_gpu_memory_utilization × GPU memory, held all run
  activations        per token and layer full = c·(7h + 4·kv + 4i) + 8h (RMSNorm's fp32 upcasts;
                     eager attention adds 2·heads·L·c). Checkpointed: c·h a layer + one layer
                     recomputed with its gradients (2·full); not: (layers+1)·full. Over
                     micro_batch·L tokens, and a trainable tower's over its patches or frames.
  logits             micro_batch·C·V·(4 + 4 + c): the fp32 logits and log-softmax that
                     `Policy.completion_logprobs` materialises, and the model's own output
  runtime            2 GiB: CUDA context, NCCL buffers, allocator slack
A phase's total is the held rows plus its own; the peak is the larger of the rollout and update
phases; a strategy fits when its peak is within the GPU memory. The prompt P is one image at
model.max_pixels (Qwen-VL: pixels/(28·28) tokens) or a 30 s clip (750 audio tokens), plus 256
text tokens; C = rollout.max_new_tokens; every sequence is taken at full length.

Left out: the extra forwards of auxiliary objectives (PIRL consistency, recycled rollouts), the
logprob recompute before the update (no gradients: less than the update), eval generation,
checkpoint-saving buffers, fragmentation beyond the fixed slack, CPU offload.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from mmrlvr.config import Config, ConfigError
from mmrlvr.rollout import resolve_backend
from mmrlvr import models

GiB = 2 ** 30
STRATEGIES = ("ddp", "fsdp2")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
TEXT_TOKENS = 256
"""Prompt text budget: system prompt, question, format instructions."""
CLIP_MEL_FRAMES = 3000
"""Mel frames of the 30 s clip a planned audio prompt holds (100 a second); its audio tokens are
the family's own count (`Family.output_lengths`: 750 for Qwen2-Audio and Qwen2.5-Omni, 25 a
second after pooling; 390 for the Qwen3-Omni thinker, 13 a second)."""
RUNTIME = 2 * GiB


BUILTIN: dict[str, dict] = {hub: spec for f in models.FAMILIES for hub, spec in f.published.items()}
"""Published config.json dims of the families' releases (`Family.published`), so `mmrlvr plan`
works offline for hub ids that are not on this machine."""


def load_hf_config(path: str):
    """(transformers config, where it came from) for a local dir, the HF cache, or `BUILTIN`."""
    from transformers import AutoConfig

    if Path(path).is_dir():
        return AutoConfig.from_pretrained(path), f"config from {path}"
    try:
        return (AutoConfig.from_pretrained(path, local_files_only=True),
                f"config of {path} from the HF cache")
    except (OSError, ValueError):
        pass
    known = {k.lower(): k for k in BUILTIN}
    if path.lower() in known:
        spec = json.loads(json.dumps(BUILTIN[known[path.lower()]]))
        return (AutoConfig.for_model(spec.pop("model_type"), **spec),
                f"dims from the built-in table for {known[path.lower()]}")
    raise ConfigError(f"model.path {path!r}: no model dir there (build it first: `mmrlvr tiny`, "
                      f"or the stage that writes it), and as a hub id it is neither in the HF "
                      f"cache nor in the built-in table ({', '.join(BUILTIN)}): download it "
                      f"first (huggingface-cli download {path}) or set model.path to a local dir")


def meta_model(config):
    """The model `Policy.load` builds from `config` (its family's), on the meta device: no
    memory, no weights."""
    try:
        return models.of_config(config).meta_model(config)
    except models.FamilyError as err:
        raise ConfigError(str(err)) from None


@dataclass
class Dims:
    """What the arithmetic needs from one model and the config's trainable set."""

    towers: dict[str, int]      # language model / vision tower / audio tower -> parameters
    total: int
    trainable: int
    root: tuple[int, int]       # FSDP2's root unit: (parameters, trainable ones) outside the rest
    block: tuple[int, int]      # the largest other unit's (parameters, trainable ones)
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_dim: int                 # kv_heads · head_dim
    vocab: int
    encoders: dict[str, tuple[int, int, int]]   # tower -> (width, intermediate, depth)
    image_tokens: int = 0       # tokens of one image at model.max_pixels (the family's geometry)
    active: int = 0             # parameters a token runs through (MoE: top-k of the experts)
    kv_layers: int = 0          # layers with a KV cache (Qwen3.5: the full-attention ones only)
    audio_tokens: int = 0       # tokens of one 30 s clip (the family's encoder count)


def inspect_model(model, cfg: Config) -> Dims:
    import torch

    from mmrlvr.train.parallel import shard_units       # what fully_shard_model wraps

    mc, lora = cfg.model, cfg.model.lora.r > 0
    family = models.of_model(model)
    frozen = {"vision tower": mc.freeze_vision, "audio tower": mc.freeze_audio,
              "language model": mc.freeze_language}
    towers = {"language model": 0, "vision tower": 0, "audio tower": 0}
    wrapped = {id(m) for m in shard_units(model, family)}
    units = [n for n, mod in model.named_modules() if n and id(mod) in wrapped]
    owned = {u: [0, 0] for u in [*units, ""]}      # unit -> [parameters, trainable]; "" the root
    experts = 0
    for name, p in model.named_parameters():       # tied weights count once, as in parameters()
        experts += p.numel() if ".experts." in f".{name}" else 0
        tower, unit = family.tower_of(name), max((u for u in units if name.startswith(u + ".")),
                                        key=len, default="")        # its innermost unit
        towers[tower] += p.numel()
        owned[unit][0] += p.numel()
        owned[unit][1] += 0 if frozen.get(tower) else p.numel()
    root = tuple(owned.pop(""))
    trainable = sum(t for _, t in owned.values()) + root[1]
    if lora:                    # peft: adapters on every Linear named like a target; base frozen
        targets = family.lora_modules(mc.lora.target_modules)
        ends = tuple(f".{t}" for t in targets)
        trainable = sum(mc.lora.r * (m.in_features + m.out_features)
                        for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                        and (n in targets or n.endswith(ends)))
        root, owned = (root[0], 0), {u: [n, 0] for u, (n, _) in owned.items()}
    total, tc = sum(towers.values()), model.config.get_text_config()
    encoders = {}
    for tower, key in (("vision tower", "vision_config"), ("audio tower", "audio_config")):
        sub = getattr(model.config, key, None)
        if sub is None or not towers[tower]:
            continue
        if tower == "audio tower":
            encoders[tower] = (sub.d_model, sub.encoder_ffn_dim, sub.encoder_layers)
        else:
            width = getattr(sub, "embed_dim", None) or sub.hidden_size
            inter = getattr(sub, "intermediate_size", None) or width * sub.mlp_ratio
            encoders[tower] = (width, inter, getattr(sub, "depth", None) or sub.num_hidden_layers)
    heads = tc.num_attention_heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    return Dims(towers={k: v for k, v in towers.items() if v}, total=total, trainable=trainable,
                root=root, block=tuple(max(owned.values(), default=(0, 0))),
                hidden=tc.hidden_size, inter=_mlp_width(tc), layers=tc.num_hidden_layers,
                heads=heads, kv_dim=getattr(tc, "num_key_value_heads", heads) * head_dim,
                vocab=tc.vocab_size, encoders=encoders,
                image_tokens=family.tokens_per_image(model.config, mc.max_pixels),
                active=total - round(experts * (1 - _top_k_share(tc))),
                kv_layers=_kv_layers(tc),
                audio_tokens=(int(family.output_lengths(torch.tensor([CLIP_MEL_FRAMES]))[0])
                              if family.modality == "audio" else 0))


def _kv_layers(text_config) -> int:
    """Layers that keep a KV cache: all, or where `layer_types` names linear-attention layers
    (Qwen3.5's Gated DeltaNet, a fixed-size recurrent state), the full-attention ones."""
    types = getattr(text_config, "layer_types", None)
    if not types:
        return int(text_config.num_hidden_layers)
    return sum(1 for t in types if t != "linear_attention")


def _mlp_width(text_config) -> int:
    """The MLP width a token's activations take: `intermediate_size`, or, where a MoE config has
    none (Qwen3.5-MoE: every layer sparse), its top-k routed experts plus the shared one."""
    width = getattr(text_config, "intermediate_size", None)
    if width:
        return int(width)
    return (int(text_config.num_experts_per_tok) * int(text_config.moe_intermediate_size)
            + int(getattr(text_config, "shared_expert_intermediate_size", 0) or 0))


def _top_k_share(text_config) -> float:
    """The share of a MoE layer's experts one token runs through (1: a dense model)."""
    n = getattr(text_config, "num_experts", None) or getattr(text_config, "num_local_experts", None)
    k = getattr(text_config, "num_experts_per_tok", None)
    return k / n if n and k else 1.0


@dataclass
class Row:
    name: str
    phase: str                  # "held" (all run), "rollout" or "update"
    ddp: int                    # bytes per GPU
    fsdp2: int
    counted: bool = True        # False: shown beside its alternative, not in the totals


def prompt_tokens(cfg: Config, d: Dims) -> int:
    return (d.audio_tokens if cfg.model.modality == "audio" else d.image_tokens) + TEXT_TOKENS


def uses_reference(cfg: Config) -> bool:
    frozen_teacher = any(o.get("name") == "pwsd" and o.get("teacher") == "frozen"
                         for o in cfg.objectives)
    return (cfg.algo.beta > 0 or frozen_teacher) and cfg.model.lora.r == 0


def _layer_bytes(h: int, kv: int, i: int, c: int) -> int:
    return c * (7 * h + 4 * kv + 4 * i) + 8 * h


def build_rows(d: Dims, cfg: Config, gpus: int, gpu_mem: float) -> list[Row]:
    """Every component's bytes per GPU under both strategies (the module docstring's formulas)."""
    m, ro, tr = cfg.model, cfg.rollout, cfg.train
    c, p = DTYPE_BYTES.get(m.dtype, 2), DTYPE_BYTES[m.param_dtype]    # `auto`: bf16 on CUDA
    W, T, N = gpus, d.trainable, d.total
    P, C = prompt_tokens(cfg, d), ro.max_new_tokens
    L = P + C
    cname, pname = ("bf16" if c == 2 else "fp32"), ("bf16" if p == 2 else "fp32")
    rows: list[Row] = []

    def add(name, phase, ddp, fsdp2=None, counted=True):
        rows.append(Row(name, phase, int(ddp), int(ddp if fsdp2 is None else fsdp2), counted))

    def sharded(name, phase, nbytes):
        add(name, phase, nbytes, math.ceil(nbytes / W))

    sharded(f"trainable weights ({pname} masters)", "held", T * p)
    if m.lora.r > 0:            # Policy.load: a LoRA base in the compute dtype, else all in p
        sharded(f"frozen base weights ({cname})", "held", N * c)
    else:
        sharded(f"frozen weights ({pname})", "held", (N - T) * p)
    sharded(f"AdamW moments (2 x {pname})", "held", 2 * T * p)
    add(f"DDP gradient buckets ({pname})", "held", T * p if W > 1 else 0, 0)  # one GPU: no DDP
    if uses_reference(cfg):
        sharded(f"reference model ({cname})", "held", N * c)
    add("CUDA context, NCCL, allocator slack", "held", RUNTIME)
    cast = T * c if p != c else 0
    if resolve_backend(ro.backend) == "vllm":
        add(f"vLLM reservation ({ro.vllm_gpu_memory_utilization:g} of the GPU)", "held",
            ro.vllm_gpu_memory_utilization * gpu_mem * GiB)
    else:
        S = math.ceil(tr.batch_prompts * ro.group_size / W)
        add(f"{cname} weights for generate (ddp: cast; fsdp2: all gathered)", "rollout",
            cast, N * c)
        add(f"KV cache ({S} seq x {L} tok)", "rollout", S * L * (d.kv_layers or d.layers) * 2 * d.kv_dim * c)
        add(f"prefill working set ({S} seq x {P} tok)", "rollout",
            S * P * (2 * d.hidden + 3 * d.inter) * c + S * d.vocab * 4 * 2)
    # ddp on 2+ GPUs: the gradients are views into the buckets (gradient_as_bucket_view)
    add(f"gradients ({pname})", "update", 0 if W > 1 else T * p, math.ceil(T * p / W))
    (root, root_tr), (blk, blk_tr) = d.root, d.block
    add(f"{cname} weights in flight (ddp: cast; fsdp2: root + 2 units)", "update", cast,
        (root + 2 * blk + root_tr + 2 * blk_tr) * c)
    tokens, full = tr.micro_batch * L, _layer_bytes(d.hidden, d.kv_dim, d.inter, c)
    if m.attn_implementation == "eager":
        full += 2 * d.heads * L * c
    on, off = tokens * (d.layers * c * d.hidden + 2 * full), tokens * (d.layers + 1) * full
    for tower, (width, inter, depth) in d.encoders.items():
        if m.lora.r > 0 or (m.freeze_vision if tower == "vision tower" else m.freeze_audio):
            continue            # no gradient flows into the tower: it keeps nothing for backward
        units = tr.micro_batch * (4 * d.image_tokens if tower == "vision tower"
                                  else 2 * d.audio_tokens)      # patches before the 2x2 merge
        enc = _layer_bytes(width, width, inter, c)
        on, off = on + units * (depth * c * width + 2 * enc), off + units * (depth + 1) * enc
    ckpt = m.gradient_checkpointing
    add("activations, checkpointing on" + (" (used)" if ckpt else ""), "update", on, counted=ckpt)
    add("activations, checkpointing off" + ("" if ckpt else " (used)"), "update", off,
        counted=not ckpt)
    add(f"logits ({tr.micro_batch} x {C} x {d.vocab}; fp32 x 2 + {cname})", "update",
        tr.micro_batch * C * d.vocab * (8 + c))
    return rows


@dataclass
class Plan:
    """Per-GPU memory of one config on `gpus` GPUs of `gpu_mem` GiB, under DDP and FSDP2."""

    cfg: Config
    dims: Dims
    gpus: int
    gpu_mem: float
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    label: str = "config"

    def engine(self, strategy: str) -> str:
        """`ddp` or `fsdp2` for a `train.strategy` value (`auto` resolved)."""
        if strategy == "auto":
            return self.choose_strategy()
        if strategy not in STRATEGIES:
            raise ConfigError(f"strategy {strategy!r}: choose one of auto, {', '.join(STRATEGIES)}")
        return strategy

    def total(self, strategy: str, phase: str) -> int:
        return sum(getattr(r, self.engine(strategy)) for r in self.rows
                   if r.counted and r.phase in ("held", phase))

    def peak(self, strategy: str) -> tuple[int, str]:
        return max((self.total(strategy, ph), ph) for ph in ("rollout", "update"))

    def fits(self, strategy: str) -> bool:
        return self.peak(strategy)[0] <= self.gpu_mem * GiB

    def choose_strategy(self) -> str:
        """`ddp` when the model with its optimiser and working memory fits one GPU, else `fsdp2`."""
        return "ddp" if self.fits("ddp") else "fsdp2"

    def strategy(self) -> str:
        """The engine the config runs with (`train.strategy`, `auto` resolved)."""
        return self.engine(self.cfg.train.strategy)

    def with_gpus(self, gpus: int) -> Plan:
        return Plan(self.cfg, self.dims, gpus, self.gpu_mem,
                    build_rows(self.dims, self.cfg, gpus, self.gpu_mem), self.notes, self.label)

    def check(self, strategy: str) -> None:
        """Raise ConfigError naming what is over, by how much, and what to change."""
        strategy = self.engine(strategy)
        if self.fits(strategy):
            return
        peak, phase = self.peak(strategy)
        parts = sorted((r for r in self.rows if r.counted and r.phase in ("held", phase)),
                       key=lambda r: -getattr(r, strategy))[:3]
        largest = ", ".join(f"{r.name} {getattr(r, strategy) / GiB:.1f}" for r in parts)
        m, tr = self.cfg.model, self.cfg.train
        tips = ["train.strategy=fsdp2" + (" (fits as is)" if self.fits("fsdp2") else "")] \
            if strategy == "ddp" else []
        need = next((w for w in range(self.gpus + 1, tr.batch_prompts + 1)   # batches divide
                     if tr.batch_prompts % w == 0 and self.with_gpus(w).fits("fsdp2")), 0)
        tips.append(f"more GPUs (fsdp2 fits on {need} x {self.gpu_mem:g} GiB)" if need else
                    f"more GPUs alone will not do (up to train.batch_prompts = {tr.batch_prompts})")
        if not m.gradient_checkpointing:
            tips.append("model.gradient_checkpointing=true")
        if m.lora.r == 0:
            tips.append("LoRA (model.lora.r=64: only the adapters train)")
        if phase == "update" and tr.micro_batch > 1:
            tips.append(f"a smaller train.micro_batch (now {tr.micro_batch})")
        if phase == "rollout" and resolve_backend(self.cfg.rollout.backend) == "hf":
            tips.append("fewer rollout sequences per GPU (train.batch_prompts x "
                        "rollout.group_size) or a smaller rollout.max_new_tokens")
        raise ConfigError(
            f"{self.label} does not fit {strategy} on {self.gpus} x {self.gpu_mem:g} GiB: its "
            f"{phase} phase needs {peak / GiB:.1f} GiB per GPU, {peak / GiB - self.gpu_mem:.1f} "
            f"GiB over (largest: {largest} GiB). To fit, try: {'; '.join(tips)}.")

    def to_dict(self) -> dict:
        """The plan as JSON-able data; every size in bytes per GPU."""
        d = self.dims
        totals = {s: {ph: self.total(s, ph) for ph in ("rollout", "update")} for s in STRATEGIES}
        for s in STRATEGIES:
            totals[s].update(peak=self.peak(s)[0], fits=self.fits(s))
        return {"config": self.label, "model": self.cfg.model.path, "gpus": self.gpus,
                "gpu_mem_gib": self.gpu_mem, "rows": [vars(r).copy() for r in self.rows],
                "params": {"total": d.total, "trainable": d.trainable, **d.towers},
                "totals": totals, "strategy": self.strategy(), "notes": list(self.notes)}

    def table(self) -> str:
        d, m = self.dims, self.cfg.model
        frozen = {"vision tower": m.freeze_vision, "audio tower": m.freeze_audio,
                  "language model": m.freeze_language}
        towers = ", ".join(f"{k} {v / 1e9:.3f} B" + (" (frozen)" if frozen.get(k) else "")
                           for k, v in d.towers.items())
        what = f"LoRA r={m.lora.r} adapters" if m.lora.r > 0 else "full fine-tune"

        def line(name, ddp, fsdp2, indent=4):
            cell = lambda v: f"{v:>9}" if isinstance(v, str) else f"{v / GiB:9.2f}"  # noqa: E731
            return f"{' ' * indent}{name:<{64 - indent}}{cell(ddp)}{cell(fsdp2)}"

        out = [f"mmrlvr plan: {self.label}", f"  model      {m.path}",
               f"  params     {d.total / 1e9:.3f} B: {towers}"
               + (f"; {d.active / 1e9:.3f} B active per token (MoE: top-k experts, all else counted)" if d.active < d.total else ""),
               f"  trainable  {d.trainable / 1e9:.3f} B ({what})",
               f"  GPUs       {self.gpus} x {self.gpu_mem:g} GiB", "",
               line("GiB per GPU", "ddp", "fsdp2", 2)]
        for phase, title in (("held", "held all run"),
                             ("rollout", f"rollout phase ({resolve_backend(self.cfg.rollout.backend)})"),
                             ("update", "update phase")):
            out.append(f"  {title}")
            out += [line(r.name, r.ddp, r.fsdp2) for r in self.rows if r.phase == phase]
            if phase != "held":
                out.append(line(f"= {phase} total (held + {phase})",
                                *(self.total(s, phase) for s in STRATEGIES)))
        yes = lambda s: "yes" if self.fits(s) else "no"     # noqa: E731
        out += [line("peak (the larger phase)", *(self.peak(s)[0] for s in STRATEGIES), 2),
                line("GPU budget", *[self.gpu_mem * GiB] * 2, 2),
                line("fits", yes("ddp"), yes("fsdp2"), 2), "",
                f"  train.strategy {self.cfg.train.strategy} -> {self.strategy()}: "
                + ("fits" if self.fits(self.strategy()) else "DOES NOT FIT")]
        return "\n".join(out + [f"  note: {n}" for n in self.notes])


def _gpu_defaults(gpus: int | None, gpu_mem: float | None) -> tuple[int, float, list[str]]:
    import torch

    notes, visible = [], torch.cuda.is_available() and torch.cuda.device_count() > 0
    if gpus is None:
        gpus = torch.cuda.device_count() if visible else 1
        notes.append(f"{gpus} GPUs: the visible ones" if visible else
                     "1 GPU assumed: no GPU visible")
    if gpu_mem is None and visible:
        props = torch.cuda.get_device_properties(0)
        gpu_mem = props.total_memory / GiB
        notes.append(f"{gpu_mem:.1f} GiB per GPU: the visible {props.name}")
    elif gpu_mem is None:
        gpu_mem = 80.0
        notes.append("80 GiB assumed: no GPU visible")
    return gpus, float(gpu_mem), notes


def make_plan(cfg: Config, gpus: int | None = None, gpu_mem_gib: float | None = None,
              label: str = "config") -> Plan:
    """Plan `cfg` on `gpus` GPUs of `gpu_mem_gib` GiB (default: the visible ones, else 1 x 80).

    Never loads weights: the model is counted on the meta device.
    """
    if not cfg.model.path:
        raise ConfigError("model.path is empty: give a local model dir or hub id")
    gpus, gpu_mem, notes = _gpu_defaults(gpus, gpu_mem_gib)
    if gpus < 1 or gpu_mem <= 0:
        raise ConfigError(f"--gpus must be >= 1 and --gpu-mem > 0 (got {gpus}, {gpu_mem:g})")
    try:
        hf_config, source = load_hf_config(cfg.model.path)
    except ConfigError as err:  # a chain's later stage (runs/x/final) is built from sft.init
        init = cfg.sft.init
        if not init or init == cfg.model.path or Path(cfg.model.path).exists():
            raise
        try:
            hf_config, source = load_hf_config(init)
        except ConfigError:
            raise err from None
        source = f"model.path {cfg.model.path} is not built yet: {source} (sft.init, its start)"
    dims = inspect_model(meta_model(hf_config), cfg)
    media = (f"{dims.audio_tokens} audio (a 30 s clip)" if cfg.model.modality == "audio"
             else f"{dims.image_tokens} image (one at model.max_pixels)")
    compute = "bfloat16 (model.dtype auto: bf16 on CUDA)" if cfg.model.dtype == "auto" \
        else cfg.model.dtype
    held = "the frozen LoRA base in the compute dtype" if cfg.model.lora.r > 0 else \
        "frozen towers in it too (Policy.load loads the whole model so)"
    notes = [source, *notes,
             f"compute {compute}; trainable weights, gradients and AdamW in "
             f"{cfg.model.param_dtype}; {held}",
             f"prompt {prompt_tokens(cfg, dims)} tokens = {media} + {TEXT_TOKENS} text, then "
             f"rollout.max_new_tokens = {cfg.rollout.max_new_tokens}"]
    if uses_reference(cfg):
        notes.append("a reference model is held (algo.beta > 0 or a frozen pwsd teacher)")
    return Plan(cfg, dims, gpus, gpu_mem, build_rows(dims, cfg, gpus, gpu_mem), notes, label)


def cmd_plan(args) -> int:
    """`mmrlvr plan CONFIG [overrides] [--gpus N] [--gpu-mem GIB] [--json]`: 0 fits, 1 not."""
    from mmrlvr.config import load_config, resolve_model_defaults

    plan = make_plan(resolve_model_defaults(load_config(args.config, args.overrides)), args.gpus,
                     args.gpu_mem,
                     label=str(args.config))
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.table())
    try:
        plan.check(plan.strategy())
    except ConfigError as err:
        if not args.json:
            print(f"\n{err}")
        return 1
    return 0
