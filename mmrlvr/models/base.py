"""What a model family is: everything about one architecture that the core and the adapters ask.

A family answers from the model dir's own `config.json` and processor, never from `mmrlvr tiny`'s
conventions, so a checkpoint made elsewhere works. The core never tests a `model_type`: it asks
the family for the class to load, the towers to freeze, the FSDP2 units, the LoRA targets, the
vLLM weight names and the planner's dims; the adapters ask it for the processor's geometry, the
placeholder tokens, how media tensors split per sample, the position ids and the media features.
A new family is one file here (a subclass registered in `mmrlvr.models`), its tiny builder and
its tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch


class FamilyError(ValueError):
    """A model dir no family serves, or a processor that does not match its model."""


@dataclass(frozen=True)
class ExpertSplit:
    """A fused expert parameter that the family's checkpoints hold as one weight per expert.

    transformers 5 holds all experts of a layer in one [E, k·out, in] parameter where the
    checkpoint has E·k [out, in] weights; its save stacks them back apart. The vLLM sync does
    the same, so the engine is fed the names and tensors of the checkpoint on disk.
    """

    fused: str
    """The end of the fused parameter's name, e.g. `mlp.experts.gate_up_proj`."""
    parts: tuple[str, ...]
    """The checkpoint projections it concatenates along its dim 1, in order: expert e's part j
    is `fused[e]`'s j-th of k equal row blocks, sent as `<module>.{e}.{part}.weight`."""


PER_EXPERT: tuple[ExpertSplit, ...] = (
    ExpertSplit("mlp.experts.gate_up_proj", ("gate_proj", "up_proj")),
    ExpertSplit("mlp.experts.down_proj", ("down_proj",)))
"""transformers' `qwen2_moe` conversion (Qwen3.5-MoE, the Qwen3-Omni thinker): gate_up_proj
[E, 2I, H] is gate [I, H] then up [I, H] per expert, down_proj [E, H, I] one [H, I] per expert."""


TRANSPOSED_EXPERTS: tuple[str, ...] = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
"""Qwen3-VL-MoE's: its released checkpoints hold the experts fused, but as the transformers-4
modeling it was released with held them, gate_up_proj [E, H, 2I] (gate columns :I, up I:) and
down_proj [E, I, H]: the transpose of transformers 5's [E, 2I, H] / [E, H, I]. The evidence is
transformers 5's own load: `conversion_mapping.py`, entry "qwen3_vl_moe", converts
`mlp.experts.gate_up_proj` and `mlp.experts.down_proj` with `Transpose(1, 2, check_dims=True)`
(`core_model_loading.Transpose`: swap dims 1 and 2 unless the tensor already has the model's
shape), so the release is what it transposes from. Its save does not transpose back (the reverse
op checks against the model's own shape too, so it writes [E, 2I, H]), which is why the sync
cannot be checked against `save_pretrained` here. (check_dims cannot tell the layouts apart
where H = 2I, e.g. the default tiny model; the released 30B-A3B has H 2048, I 768.) vLLM's
Qwen3-VL-MoE decoder layer loads fused experts with `is_fused_checkpoint_transposed=True`: it
takes the checkpoint's layout."""


@dataclass(frozen=True)
class VllmNames:
    """How one family's transformers-5 parameter names become its checkpoint names (vLLM's)."""

    renames: tuple[tuple[str, str], ...]
    """(transformers-5 prefix, checkpoint prefix), first match wins."""
    roots: tuple[str, ...]
    """Every checkpoint name starts with one of these."""
    media: str | None
    """The `multi_modal_data` key of its prompts (vLLM's `limit_mm_per_prompt` modality); None
    for a text-only family, whose engine gets no `limit_mm_per_prompt` (older vLLM releases
    refuse it for a model without media)."""
    experts: tuple[ExpertSplit, ...] = ()
    """Fused expert parameters sent one weight per expert, as the checkpoint holds them (none:
    every parameter is sent whole, under its checkpoint name)."""
    transposed: tuple[str, ...] = ()
    """Ends of the fused expert parameters that the checkpoint holds fused but with dims 1 and 2
    swapped ([E, in, out] for transformers 5's [E, out, in]): sent whole, transposed so (a view)."""


def text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class Family:
    """One architecture line. Subclasses set the class attributes and override the hooks whose
    default does not fit; the defaults are those of a Qwen-style decoder with 1-D positions."""

    name: ClassVar[str] = ""
    """The family's name (`mmrlvr tiny NAME`, the README's model table)."""
    model_types: ClassVar[tuple[str, ...]] = ()
    """`config.json` `model_type` values this family trains."""
    wrapper_types: ClassVar[tuple[str, ...]] = ()
    """`model_type`s of full checkpoints whose part this family trains (an Omni model's thinker)."""
    classes: ClassVar[tuple[str, ...]] = ()
    """transformers classes, the first one this transformers has is loaded."""
    modality: ClassVar[str] = "vision"
    """The adapter that feeds it (`modalities.get`)."""
    image_token: ClassVar[str | None] = None
    video_token: ClassVar[str | None] = None
    audio_token: ClassVar[str | None] = None
    pixel_bounds: ClassVar[bool] = False
    """Images are resized within `model.min_pixels`..`max_pixels` (dynamic resolution); the
    tiled families' processors size every image themselves."""
    video_key: ClassVar[str | None] = None
    """The media key whose `media_rows` range counts videos; None: the family takes no video
    (a row with one is refused, naming it)."""
    image_marker: ClassVar[str | None] = None
    """What the chat template writes for one image (the processor expands it); default
    `image_token`."""
    placeholder_tokens: ClassVar[tuple[str, ...]] = ()
    """Tokens that stand for media: never sampled, scrubbed from completions."""
    stop_tokens: ClassVar[tuple[str, ...]] = ("<|im_end|>", "<|endoftext|>")
    """Tokens that end a completion besides the generation config's eos."""
    vision_towers: ClassVar[tuple[str, ...]] = ()
    """Module names (a path part) of the vision encoder: frozen by `model.freeze_vision`."""
    audio_towers: ClassVar[tuple[str, ...]] = ()
    """Module names of the audio encoder: frozen by `model.freeze_audio`."""
    unit_classes: ClassVar[tuple[str, ...]] = ("DecoderLayer", "EncoderLayer", "VisionBlock")
    """Class-name endings of the modules that become one FSDP2 unit each (decoder layers,
    encoder blocks; a MoE family's expert blocks too)."""
    media_inputs: ClassVar[tuple[str, ...]] = ()
    """Forward arguments that carry raw media; a forward without any runs `tower_zero` under
    FSDP2."""
    lora_targets: ClassVar[tuple[str, ...]] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """What `model.lora.target_modules: [auto]` adapts (the language model's attention)."""

    def lora_modules(self, configured: list[str]) -> list[str]:
        """`model.lora.target_modules` with `auto` replaced by this family's targets."""
        return list(self.lora_targets) if list(configured) == ["auto"] else list(configured)
    vllm: ClassVar[VllmNames | None] = None
    """Weight names for the vLLM backend; None: vLLM rollouts are not supported."""
    published: ClassVar[dict[str, dict]] = {}
    """Hub id -> its published config.json dims, so `mmrlvr plan` works offline."""
    tiny: ClassVar[str | None] = None
    """The `mmrlvr tiny` kind of this family, if it has one."""
    time_positions: ClassVar[bool] = False
    """Positions place audio tokens by time: they need each clip's `feature_attention_mask`."""
    repeatable_cache: ClassVar[bool] = True
    """A prompt's KV cache can be repeated for its G completions (one prefill per prompt); not
    for linear-attention layers (Qwen3.5's Gated DeltaNet), whose state transformers cannot repeat."""
    moe: ClassVar[bool] = False
    """A mixture-of-experts text model (router loss, total vs active parameters)."""
    processors: ClassVar[tuple[str, ...]] = ()
    """Processor class names of this family (to find the family of a processor alone)."""

    def __repr__(self) -> str:
        return f"<family {self.name}>"

    # ---------------------------------------------------------------- loading
    def unwrap_config(self, config: Any) -> Any:
        """The config of the part trained (default: the whole model)."""
        return config

    def model_class(self) -> type:
        import transformers

        for name in self.classes:
            cls = getattr(transformers, name, None)
            if cls is not None:
                return cls
        raise FamilyError(f"family {self.name}: this transformers ({transformers.__version__}) has "
                          f"none of {list(self.classes)}; upgrade transformers")

    def load(self, path: str, **kwargs: Any) -> torch.nn.Module:
        return self.model_class().from_pretrained(path, **kwargs)

    def meta_model(self, config: Any) -> torch.nn.Module:
        """The model `load` builds, on the meta device (no memory, no weights)."""
        with torch.device("meta"):
            return self.model_class()._from_config(self.unwrap_config(config))

    def tower_of(self, name: str) -> str:
        """'vision tower', 'audio tower' or 'language model' for a parameter name."""
        parts = set(name.split("."))
        if parts & set(self.vision_towers):
            return "vision tower"
        if parts & set(self.audio_towers):
            return "audio tower"
        return "language model"

    def check_processor(self, processor: Any, config: Any) -> None:
        """Raise FamilyError naming both when `processor` cannot feed a model of `config`."""
        tokenizer = getattr(processor, "tokenizer", processor)
        for attr, token in (("image_token_id", self.image_token), ("audio_token_id", self.audio_token)):
            want = _token_id(config, attr)
            if token is None or want is None:
                continue
            have = tokenizer.convert_tokens_to_ids(token)
            if have != want:
                raise FamilyError(
                    f"the processor does not match the model: its tokenizer gives {token} the id "
                    f"{have}, the {self.name} model's config.json expects {attr} {want}; save the "
                    "processor of this checkpoint with it (processor.save_pretrained(dir))")

    def tokens_per_image(self, config: Any, max_pixels: int) -> int:
        """Tokens one image of `max_pixels` pixels makes (0: the family takes no images)."""
        return 0

    def tower_zero(self, model: torch.nn.Module, device: torch.device) -> torch.Tensor | None:
        """0, computed through every media tower on the smallest dummy input (None: no tower).

        Under FSDP2 each tower is a sharded unit: a rank whose batch has no media would skip its
        all-gather and reduce-scatter while the others run them. Added to the embeddings, this
        zero runs the tower in the same place of the forward (and of the backward) on every rank
        and changes no value or gradient.
        """
        return None

    # ---------------------------------------------------------------- forward
    def position_ids(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]
                     ) -> torch.Tensor | None:
        """Position ids of a training forward, as `generate` computes them: here 1-D over the
        real tokens only (`cumsum - 1`), so a left-padded row sees the positions it has alone."""
        mask = inputs["attention_mask"]
        return (mask.long().cumsum(-1) - 1).clamp(min=0)


def text_dims(h: int, i: int, layers: int, heads: int, kv: int, vocab: int, tied: bool) -> dict:
    """A release's text-model dims as its config.json states them (`Family.published`)."""
    return dict(hidden_size=h, intermediate_size=i, num_hidden_layers=layers, vocab_size=vocab,
                num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied)


def _token_id(config: Any, attr: str) -> int | None:
    for c in (config, getattr(config, "thinker_config", None)):
        if c is None:
            continue
        for name in (attr, attr.replace("_id", "_index")):
            value = getattr(c, name, None)
            if isinstance(value, int):
                return value
    return None
