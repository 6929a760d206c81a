"""The training model's weights, unit by unit, in the names and dtype vLLM's `load_weights` takes.

What vLLM is fed: checkpoint names. Each vLLM model's `load_weights` reads the names of the
checkpoint on disk (through the architecture's `hf_to_vllm_mapper`, where it has one), and that
is the one naming every vLLM release must accept. transformers 5 names modules differently from
its checkpoints and reverts the renaming on save; `checkpoint_name` does the same revert, per
architecture (vLLM 0.33's mappers, read for this, in brackets):

  Qwen2-VL, Qwen2.5-VL   model.language_model.X -> model.X      [model. -> language_model.model.]
                         model.visual.X         -> visual.X     [visual. stays]
                         lm_head.X              -> lm_head.X    [-> language_model.lm_head.]
  Qwen2-Audio            model.language_model.X -> language_model.model.X  [no mapper: module
                         model.audio_tower.X    -> audio_tower.X            tree names, which
                         model.multi_modal_projector.X -> multi_modal_projector.X   the checkpoint
                         lm_head.X              -> language_model.lm_head.X         uses as well]
  Qwen3-VL (+MoE),        names unchanged: their checkpoints use transformers 5's  [model.visual. ->
  Qwen3.5, GLM-4.1V      model.language_model. / model.visual. / lm_head.        visual., model.
                                                 language_model. -> language_model.model., lm_head.
                                                 -> language_model.lm_head.]
                         and Qwen3-VL-MoE's fused experts transposed (below)
  Gemma 3, InternVL,     as Qwen2-Audio, with vision_tower. for audio_tower.   [their mappers take
  Mistral 3                                      the transformers-4 tree as it is]
  LLaVA-OneVision        as Gemma 3, and model.image_newline -> image_newline   [vLLM's modules]
  SmolVLM                names unchanged: model.text_model. / model.vision_model. /   [no mapper:
                         model.connector. / lm_head.             vLLM's module tree is the same]
  Qwen3.5-MoE            as Qwen3.5, experts split (below)      [Qwen3.5's; experts.{e}.gate_proj.
                                                                 etc. by its expert mapping]
  Qwen3-Omni thinker     model.language_model.X -> thinker.model.X   [thinker.model. ->
                         model.audio_tower.X -> thinker.audio_tower.X   language_model.model.,
                         model.visual.X -> thinker.visual.X          thinker.lm_head. ->
                         lm_head.X -> thinker.lm_head.X, experts     language_model.lm_head.,
                         split (below)                               thinker. -> '']
  Qwen2.5-Omni thinker   as the Qwen3-Omni thinker, no experts      [the same mapper; talker.,
                                                                 token2wav. skipped]
  Llama (SmolLM2)        names unchanged: model. / lm_head.         [no mapper: vLLM's module
                         (tied embeddings: one parameter, sent   tree is the same; lm_head.
                         as model.embed_tokens.weight, as saved)  skipped when tied]

Split experts (`VllmNames.experts`): the transformers-5 MoE layer holds its experts fused,
`experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I], where these two families'
checkpoints hold one weight per expert: `experts.{e}.gate_proj.weight` [I, H] (rows :I of
gate_up_proj[e]), `experts.{e}.up_proj.weight` (rows I:) and `experts.{e}.down_proj.weight`
[H, I] — what transformers' own save writes (its qwen2_moe conversion run backwards), checked
value for value. The sync cuts them so, inside the decoder layer's unit.

Transposed experts (`VllmNames.transposed`): Qwen3-VL-MoE's released checkpoints hold the experts
fused, under the same names, but transposed: `experts.gate_up_proj` [E, H, 2I] and
`experts.down_proj` [E, I, H], as its transformers-4 modeling held them. transformers 5 says so
itself: its `conversion_mapping.py` entry "qwen3_vl_moe" loads both with
`Transpose(1, 2, check_dims=True)`, and vLLM's Qwen3-VL-MoE layers load fused experts with
`is_fused_checkpoint_transposed=True`. Its save does not transpose back (check_dims compares
with the model's own shape), so here the reference is a file in the released layout that
transformers loads back to the same model (tests/test_vllm_names.py, hidden size != 2I). The sync
sends each whole, as a transposed view, inside the decoder layer's unit.

The Qwen3-Omni and Qwen2.5-Omni names are those of the full (thinker + talker) checkpoint, the
one vLLM serves: `thinker.` before what the thinker's own save writes, as transformers saves
`Qwen3OmniMoeForConditionalGeneration` / `Qwen2_5OmniForConditionalGeneration` (tested) and as
other tools read the release's per-expert keys
(`thinker.model.layers.N.mlp.experts.E.gate_proj.weight`); the releases' indexes themselves were
not read. Every vLLM thinker mapper read takes them; newer ones also take the thinker-alone
names.

Tied embeddings (SmolLM2, tiny models of several families): the model's `named_parameters()`
holds the shared tensor once, under the embedding's name, so the sync sends
`model.embed_tokens.weight` (or the family's equivalent) and no `lm_head.weight`, exactly what
transformers' save writes (tested); vLLM ties its head to the embedding. Untied, both are sent.

Names already in checkpoint form (older transformers) pass unchanged. peft's `base_model.model.`
prefix and `.base_layer` infix, `modules_to_save`, activation-checkpoint and torch.compile
wrappers are stripped first; LoRA factors are merged into their base weight
(W + scaling·B@A, in float32, as peft's merge does) and never sent themselves. LoRA on a
parameter rather than a layer (peft's ParamWrapper: its `target_parameters`, and what peft makes
of `model.lora.target_modules` gate_proj / up_proj / down_proj on the Qwen3-Omni thinker, whose
experts are fused) is refused by name, never sent without its delta.

Unit by unit: `sync_units` walks `model.named_parameters()` (the same fixed order on every rank)
and yields one unit at a time — a decoder layer, a vision block, an audio layer, or one other
module (embeddings, norm, head, patch embedding, projector) — materialised, merged and cast to
the engine's dtype. A sharded parameter (an FSDP2 DTensor) is materialised with
`full_tensor()`, a collective: every rank must run the same sync in the same order. A unit's
full tensors are dropped before the next unit is gathered, so at most one unit is whole on a
rank at once; the full model is never gathered.

Nothing here imports vllm.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import torch

from mmrlvr import models


def architecture(model_type: str) -> models.VllmNames:
    try:
        names = models.of_type(model_type).vllm
    except models.FamilyError:
        names = None
    if names is None:
        have = sorted(t for f in models.FAMILIES if f.vllm for t in f.model_types)
        raise ValueError(f"rollout.backend 'vllm': no weight-name mapping for model type "
                         f"{model_type!r} (have {have}); use rollout.backend: hf or give the "
                         "family its `vllm` names (mmrlvr.models)")
    return names


_WRAPPERS = re.compile(
    r"(?:^|(?<=\.))(?:_checkpoint_wrapped_module|_orig_mod|_fsdp_wrapped_module)\.")
_SAVED_COPY = re.compile(r"\.modules_to_save\.[^.]+\.")
_LORA_FACTOR = re.compile(r"^(?P<module>.+)\.lora_(?P<factor>[AB])\.(?P<adapter>[^.]+)\.weight$")


def plain_name(name: str) -> str | None:
    """The model's own name for a parameter of a (peft-, checkpoint- or compile-) wrapped model,
    or None for what is not a weight of the model (LoRA factors, peft's frozen original copy)."""
    if "lora_" in name or ".original_module." in name:
        return None
    name = _WRAPPERS.sub("", name).removeprefix("base_model.model.")
    return _SAVED_COPY.sub(".", name).replace(".base_layer.", ".")


def checkpoint_name(name: str, model_type: str) -> str:
    """The checkpoint name vLLM's `load_weights` takes for the transformers module name `name`."""
    arch = architecture(model_type)
    for old, new in arch.renames:
        if name.startswith(old):
            name = new + name[len(old):]
            break
    if not name.startswith(arch.roots):
        raise ValueError(f"rollout.backend 'vllm': parameter {name!r} of a {model_type} model has "
                         f"no checkpoint name (expected one under {arch.roots}); the transformers "
                         "module layout changed: update mmrlvr.rollout.vllm_sync.ARCHITECTURES")
    return name


def checkpoint_tensors(name: str, tensor: torch.Tensor, model_type: str
                       ) -> list[tuple[str, torch.Tensor]]:
    """[(checkpoint name, tensor)] for the whole tensor of the transformers parameter `name`:
    itself under its checkpoint name, a fused expert parameter cut one weight per expert, or one
    the checkpoint holds transposed, transposed."""
    ckpt = checkpoint_name(name, model_type)
    arch = architecture(model_type)
    for split in arch.experts:
        if ckpt.endswith("." + split.fused):
            return split_experts(ckpt, tensor, split.parts)
    if any(ckpt.endswith("." + fused) for fused in arch.transposed):
        return [(ckpt, transpose_experts(ckpt, tensor))]
    return [(ckpt, tensor)]


def transpose_experts(name: str, fused: torch.Tensor) -> torch.Tensor:
    """`fused` [E, out, in] as the checkpoint's [E, in, out] (a view, no copy: vLLM's loader
    transposes it back into its own parameter)."""
    if fused.dim() != 3:
        raise ValueError(f"rollout.backend 'vllm': fused expert parameter {name} has shape "
                         f"{tuple(fused.shape)}, not [experts, out, in]; the transformers expert "
                         "layout changed: update VllmNames.transposed")
    return fused.transpose(1, 2)


def split_experts(name: str, fused: torch.Tensor, parts: tuple[str, ...]
                  ) -> list[tuple[str, torch.Tensor]]:
    """`fused` [E, k·out, in] as E·k [out, in] weights `<module>.{e}.{part}.weight` (expert by
    expert, parts in order), as transformers' save writes them; views, no copy."""
    module = name.rsplit(".", 1)[0]
    if fused.dim() != 3 or fused.shape[1] % len(parts):
        raise ValueError(f"rollout.backend 'vllm': fused expert parameter {name} has shape "
                         f"{tuple(fused.shape)}, not [experts, {len(parts)}·out, in]; the "
                         "transformers expert layout changed: update VllmNames.experts")
    return [(f"{module}.{e}.{part}.weight", weight)
            for e, expert in enumerate(fused.unbind(0))
            for part, weight in zip(parts, expert.chunk(len(parts), dim=0))]


_LAYER = re.compile(r"^(.*?\.(?:layers|blocks)\.\d+)\.")


def unit_key(name: str) -> str:
    """The sync unit a parameter belongs to: its decoder layer / block, else its own module
    (with a LoRA module's base weight and factors in one unit)."""
    layer = _LAYER.match(name)
    if layer:
        return layer.group(1)
    factor = _LORA_FACTOR.match(name)
    if factor:
        return factor.group("module")
    return name.rsplit(".", 1)[0].replace(".base_layer", "")


def materialize(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: `full_tensor()` of a sharded DTensor (a collective), else itself."""
    full = getattr(t, "full_tensor", None)   # torch's DTensor; duck-typed so tests can count calls
    return (full() if full is not None else t).detach()


def merge_lora(base: torch.Tensor, factors: list[tuple[torch.Tensor, torch.Tensor, float]],
               fan_in_fan_out: bool = False) -> torch.Tensor:
    """W + Σ scaling·B@A in float32 (peft's `get_delta_weight`). base [out, in]; A [r, in];
    B [out, r]; returns float32 [out, in]."""
    merged = base.float()
    for lora_a, lora_b, scaling in factors:
        delta = lora_b.float() @ lora_a.float()                                 # [out, in]
        merged = merged + scaling * (delta.T if fan_in_fan_out else delta)
    return merged


def _lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """peft LoRA layers by module name, each checked to be a kind the sync can merge."""
    from peft.tuners.lora import LoraLayer

    layers = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if hasattr(module, "parameter_name"):       # peft's ParamWrapper (target_parameters)
            raise NotImplementedError(
                f"rollout.backend 'vllm': LoRA module {name} adapts the parameter "
                f"{module.parameter_name!r} itself (peft's target_parameters; on a MoE model "
                "peft makes them of target_modules gate_proj/up_proj/down_proj when the experts "
                "are fused), which the weight sync does not merge; leave the experts out of "
                "model.lora.target_modules or use rollout.backend: hf")
        for adapter in module.active_adapters:
            if module.use_dora.get(adapter) or module.lora_bias.get(adapter) \
                    or adapter in getattr(module, "lora_embedding_A", {}):
                raise NotImplementedError(
                    f"rollout.backend 'vllm': LoRA module {name} (adapter {adapter!r}) uses DoRA, "
                    "a LoRA bias or an embedding adapter, which the weight sync does not merge; "
                    "use plain LoRA on linear layers or rollout.backend: hf")
        layers[name] = module
    return layers


def sync_units(model: torch.nn.Module, model_type: str, dtype: torch.dtype,
               only_trainable: bool = False) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """[(checkpoint name, whole tensor in `dtype`)] for each unit of `model`, one unit at a time.

    `only_trainable` leaves out frozen weights (not LoRA-adapted bases): right once the engine
    holds them, since they never change. Every rank must iterate the same units to the end.
    """
    lora = _lora_layers(model)
    pending: list[tuple[str, torch.nn.Parameter]] = []
    key = None
    for name, param in model.named_parameters():
        k = unit_key(name)
        if pending and k != key:
            unit = _materialize_unit(pending, lora, model_type, dtype, only_trainable)
            pending = []
            if unit:
                yield unit
            del unit                       # drop this unit before the next one is gathered
        pending.append((name, param))
        key = k
    if pending:
        unit = _materialize_unit(pending, lora, model_type, dtype, only_trainable)
        if unit:
            yield unit


def _materialize_unit(params: list[tuple[str, torch.nn.Parameter]],
                      lora: dict[str, torch.nn.Module], model_type: str, dtype: torch.dtype,
                      only_trainable: bool) -> list[tuple[str, torch.Tensor]]:
    factors: dict[tuple[str, str], dict[str, torch.Tensor]] = {}   # (module, adapter) -> A, B
    bases: list[tuple[str, str, torch.Tensor]] = []                # (module, name, full weight)
    out = []
    for name, param in params:
        factor = _LORA_FACTOR.match(name)
        if factor and factor.group("module") in lora:
            module = lora[factor.group("module")]
            if factor.group("adapter") in module.active_adapters \
                    and factor.group("adapter") not in module.merged_adapters:
                factors.setdefault((factor.group("module"), factor.group("adapter")), {})[
                    factor.group("factor")] = materialize(param)
            continue
        plain = plain_name(name)
        if plain is None:
            if "lora_" in name:
                raise NotImplementedError(f"rollout.backend 'vllm': cannot sync the LoRA parameter "
                                          f"{name}; only lora_A/lora_B of linear layers merge")
            continue
        module = name.rsplit(".", 1)[0].removesuffix(".base_layer")
        adapted = name.endswith(".base_layer.weight") and module in lora
        if only_trainable and not (param.requires_grad or adapted):
            continue
        if adapted:                        # merged below, in float32, once A and B are here
            bases.append((module, name, materialize(param)))
        else:
            out += _cast(checkpoint_tensors(plain, materialize(param), model_type), dtype)
    for module, name, weight in bases:
        layer = lora[module]
        pairs = [(f["A"], f["B"], float(layer.scaling[adapter]))
                 for (m, adapter), f in factors.items() if m == module]
        merged = merge_lora(weight, pairs, bool(getattr(layer, "fan_in_fan_out", False)))
        out += _cast(checkpoint_tensors(plain_name(name), merged, model_type), dtype)
    return out


def _cast(pairs: list[tuple[str, torch.Tensor]], dtype: torch.dtype
          ) -> list[tuple[str, torch.Tensor]]:
    """Each tensor in the engine's dtype (per expert weight: the fused whole is never copied)."""
    return [(name, tensor.to(dtype)) for name, tensor in pairs]


def load_units(units: Iterator[list[tuple[str, torch.Tensor]]],
               load: Callable[[list[tuple[str, torch.Tensor]]], object]) -> tuple[int, int]:
    """Feed each unit to `load`, dropping it before the next is gathered; (tensors, bytes) sent."""
    count = size = 0
    for unit in units:
        load(unit)
        count += len(unit)
        size += sum(t.numel() * t.element_size() for _, t in unit)
        del unit
    return count, size


def engine_seed(base_seed: int, rank: int) -> int:
    """The sampling seed of rank `rank`'s colocated engine: every rank samples its own stream."""
    return base_seed + rank
