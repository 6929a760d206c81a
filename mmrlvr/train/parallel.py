"""Processes, devices and the two ways a run spreads over them: DDP and FSDP2.

A run becomes multi-process when a launcher sets torch's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT): `torchrun --nproc_per_node N -m mmrlvr.cli train ...`,
or `accelerate launch --num_processes N -m mmrlvr.cli train ...` with accelerate as a plain
launcher. Accelerate's DeepSpeed and FSDP plugins are refused before anything loads: the engine
is `train.strategy`, and it is one of

- `ddp`: torch's DistributedDataParallel. Every rank holds the whole model (fp32 masters),
  computes in `model.dtype` under autocast, and gradients are all-reduced once per update.
- `fsdp2`: `fully_shard` on every decoder/encoder layer and vision block, on each media tower,
  then on the root, with `MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=float32)`:
  parameters, gradients and AdamW state are fp32 shards; each layer is gathered in bf16 for its
  forward and backward. `generate` runs with the whole model gathered once per call (`gathered`),
  as TRL does, not one all-gather per layer per token. Media features are computed inside the
  model's own forward here (no per-prompt sharing): calling a tower directly, outside the root's
  forward, would bypass FSDP's hooks.

Under both, every rank must run the same collectives in the same order: the trainer trains every
rollout row under more than one process (a zero-advantage row adds nothing but keeps the
micro-batch count equal), and losses are normalised by the global token count (`Dist.all_sum`)
and multiplied by the world size, because DDP and FSDP average gradients over ranks. A rank
whose micro-batch holds no image still runs the vision tower under FSDP2 (on a dummy image that
counts 0: `keep_towers_in_step`); DDP needs nothing for it (`find_unused_parameters`).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.distributed as dist

from mmrlvr.train.launch import LaunchError, refuse_lone_launch, refuse_unsupported_launch


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise LaunchError("train.device is 'cuda' but no CUDA device is visible")
    return torch.device(name)


@dataclass
class Dist:
    """This process's place in the run, and the few collectives the loop needs."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    strategy: str = "single"
    """`single` (one process), `ddp` or `fsdp2`."""

    @property
    def main(self) -> bool:
        return self.rank == 0

    def _tensor(self, values: list[float]) -> torch.Tensor:
        # gloo reduces CPU tensors, nccl CUDA ones
        return torch.tensor(values, dtype=torch.float64, device=self.device)

    def all_sum(self, value: float) -> float:
        """The sum of `value` over all ranks (itself in a one-process run)."""
        if self.world == 1:
            return value
        t = self._tensor([value])
        dist.all_reduce(t)
        return float(t.item())

    def all_mean(self, values: dict[str, float]) -> dict[str, float]:
        """Each value averaged over ranks (every rank must pass the same keys)."""
        if self.world == 1 or not values:
            return values
        keys = sorted(values)
        t = self._tensor([float(values[k]) for k in keys])
        dist.all_reduce(t)
        return dict(zip(keys, (t / self.world).tolist()))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def init(device_name: str = "auto") -> Dist:
    """This process's Dist; joins the process group when a launcher started several."""
    refuse_unsupported_launch()
    refuse_lone_launch()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist(device=pick_device(device_name))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device_name != "cpu" and torch.cuda.is_available()
    if device_name == "cuda" and not cuda:
        raise LaunchError("train.device is 'cuda' but no CUDA device is visible")
    if cuda:
        if local >= torch.cuda.device_count():
            raise LaunchError(f"local rank {local} has no GPU: {torch.cuda.device_count()} visible; "
                              "start at most that many processes per node")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return Dist(rank=rank, world=world, local_rank=local, device=device)


# ---------------------------------------------------------------- the two strategies

def shard_units(model: torch.nn.Module, family) -> list[torch.nn.Module]:
    """The modules `fully_shard` wraps, innermost first (the root comes last, separately): the
    family's layers and blocks (`Family.unit_classes`: class-name endings; a MoE family's expert
    blocks inside its layers), then each media tower whole (`vision_towers`, `audio_towers`), so
    its stem and merger are gathered with it."""
    ends = tuple(family.unit_classes)
    towers = set(family.vision_towers) | set(family.audio_towers)
    named = [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith(ends)]
    # fully_shard goes bottom-up: a unit inside another (an expert block in its layer) first
    nested = [m for n, m in named if any(n.startswith(o + ".") for o, _ in named)]
    inner = nested + [m for _, m in named if all(m is not x for x in nested)]
    whole = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in towers]
    return inner + whole


def fully_shard_model(model: torch.nn.Module, compute_dtype: torch.dtype,
                      example_input: dict[str, torch.Tensor], family) -> torch.nn.Module:
    """FSDP2 in place: one unit per layer/block/tower, then the root; bf16 compute, fp32 reduce.

    `example_input` (one short text row) runs one forward through the root right away: FSDP2
    takes the first module to run forward as its root, and towers are called directly later.
    Build the optimizer after this, from `model.parameters()` (the shards).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for unit in shard_units(model, family):
        fully_shard(unit, mp_policy=mp, reshard_after_forward=True)
    keep_towers_in_step(model, family)
    # the root's own parameters (embeddings, head) are needed again at once by the backward
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    register_fsdp_forward_method(model, "generate")
    with torch.no_grad():
        model(**example_input, use_cache=False)
    # the root keeps its parameters gathered after a forward (no backward follows this one):
    # reshard, so `model.parameters()` are the sharded fp32 masters the optimizer must hold
    model.reshard()
    return model


GATHERED = "_mmrlvr_gathered"
"""Set on a model while `gathered` holds it whole: its forwards then run no collective."""


def keep_towers_in_step(model: torch.nn.Module, family) -> None:
    """Under FSDP2, run every media tower in every forward, media or not.

    Each tower is a unit of its own: a forward that calls it all-gathers its shards, and its
    backward reduce-scatters their gradients. A rank whose micro-batch holds no image (or clip)
    would skip those collectives while the others wait in them. So a forward without media runs
    the towers on the family's smallest dummy input (`Family.tower_zero`, before the language
    model, as real media would be) and adds the result, 0, to the embeddings the language model
    takes: every value and gradient stays what it was (the towers' gradients get 0s), and the
    backward reaches the towers after the layers on every rank. Not while `gathered` (generate:
    no collectives then).
    """
    inner = getattr(model, "model", None)
    language = getattr(inner, "language_model", None)
    if not family.media_inputs or language is None:
        return
    pending: list[torch.Tensor] = []

    def run_towers(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if getattr(model, GATHERED, False) or kwargs.get("mm_encoder_outputs") or any(
                kwargs.get(k) is not None for k in family.media_inputs):
            return
        ids = kwargs.get("input_ids")
        device = ids.device if ids is not None else kwargs["inputs_embeds"].device
        pending.append(family.tower_zero(model, device))

    def add_zero(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple | None:
        if not pending:
            return None
        zero = pending.pop()
        embeds = kwargs["inputs_embeds"]
        return args, {**kwargs, "inputs_embeds": embeds + zero.to(embeds.dtype)}

    inner.register_forward_pre_hook(run_towers, with_kwargs=True)
    language.register_forward_pre_hook(add_zero, with_kwargs=True)


def fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """The whole model unsharded (in the compute dtype) for the duration: for `generate`.

    Outside FSDP2 this does nothing. Inside, each unit is all-gathered once and kept until the
    end, so decoding does not all-gather every layer for every token.
    """
    units = fsdp_units(model)
    if not units:
        yield
        return
    root = units[0] if units[0] is model else model
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    setattr(model, GATHERED, True)
    try:
        yield
    finally:
        setattr(model, GATHERED, False)
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(unit is not root, recurse=False)


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP around `model` (parameters broadcast from rank 0); unused parameters allowed (a
    frozen tower, a text-only micro-batch); the gradients live in DDP's buckets (no second
    fp32 copy of them)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True,
                                   gradient_as_bucket_view=True)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on rank 0's CPU, {} on other ranks. Every rank must call."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


def all_finite(d: Dist, params: list[torch.Tensor]) -> bool:
    """Are all of `params` finite on every rank? (Local shards under FSDP2; a collective.)"""
    with torch.no_grad():
        local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
        tensors = [t.detach() for t in local if t.numel()]
        # the largest |value| of each tensor (a norm could overflow on finite values)
        finite = bool(torch.stack(torch._foreach_norm(tensors, float("inf"))).isfinite().all()) \
            if tensors else True
    return d.all_sum(0.0 if finite else 1.0) == 0.0


def weights_fingerprint(model: torch.nn.Module) -> int:
    """An exact integer fingerprint of this rank's parameters (their bits summed as integers):
    any changed bit changes it, so DDP ranks in sync have equal fingerprints."""
    total = 0
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            flat = p.detach().contiguous().view(-1)
            bits = flat.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[flat.element_size()])
            total += (i + 1) * int(bits.long().sum())
    return total
