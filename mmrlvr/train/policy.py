"""The policy: a model and its processor, loaded from a local dir or hub id, with optional LoRA.

It computes per-token logprobs of completions given their (un-expanded) prompts, in
micro-batches — the one training forward every loss and objective goes through — and saves
itself as an HF-loadable model dir (LoRA merged on save).

Precision: trainable weights and AdamW's state are kept in `model.param_dtype` (fp32 by
default) and the forward runs in `model.dtype` (bf16 on CUDA) under autocast, or, when sharded
with FSDP2, through its MixedPrecisionPolicy. An AdamW update of lr 1e-6 moves a fp32 weight;
written into a bf16 weight of magnitude 0.02 it rounds away (half a bf16 step there is 6e-5).
With LoRA the frozen base weights are held in the compute dtype and only the adapters in fp32.
"""
from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mmrlvr.config import ModelConfig
from mmrlvr.train.logprobs import token_logprobs
from mmrlvr.train.packing import packed_logprobs
from mmrlvr.train.parallel import gathered, pick_device  # noqa: F401  (pick_device: public here too)
from mmrlvr.train.weight_files import check_finite, check_weight_files
from mmrlvr.core.types import TYPE_KEYS, ModalityAdapter, PromptBatch, select, to_device

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class PolicyError(RuntimeError):
    """A model dir that cannot be loaded as configured; the message says what is missing."""


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype `model.dtype` names (`auto`: bf16 on CUDA, fp32 on CPU)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def bf16_update_warning(params: list[torch.nn.Parameter], lr: float) -> str:
    """What pure-bf16 weights do to AdamW updates of about `lr`: the smallest change a weight of
    the median magnitude can take, and the share of weights an update of `lr` cannot move."""
    sample = torch.cat([p.detach().float().flatten()[:100_000].abs() for p in params])
    median = float(sample.median())
    # a bf16 number w has 8 significant bits: its step is 2^(floor(log2|w|) - 7); an update
    # below half a step rounds back to w
    half_step = lambda w: 2.0 ** (torch.floor(torch.log2(w.clamp(min=1e-30))) - 8)  # noqa: E731
    stuck = float((half_step(sample) > lr).float().mean())
    return (f"model.param_dtype is bfloat16: AdamW writes its update (about lr = {lr:g} per step) "
            f"into bf16 weights. A weight of the median magnitude {median:.3g} only moves by "
            f"updates of at least {float(half_step(torch.tensor(median))):.2g}, so about "
            f"{100 * stuck:.0f}% of the weights cannot change at this lr. Use model.param_dtype: "
            "float32 (the default: fp32 master weights, bf16 compute) unless this is intended.")


def load_processor(path: str) -> Any:
    from transformers import AutoProcessor

    from mmrlvr.config import ConfigError, check_model_path, missing_model_message

    local = Path(path)
    try:
        check_model_path(path)
    except ConfigError as err:
        raise PolicyError(str(err)) from None
    if local.exists() and not any((local / f).exists() for f in (
            "processor_config.json", "preprocessor_config.json", "tokenizer_config.json")):
        raise PolicyError(f"model dir {local} has no processor (no processor_config.json, "
                          "preprocessor_config.json or tokenizer_config.json); save the processor "
                          "with the model, e.g. processor.save_pretrained(dir)")
    try:
        processor = AutoProcessor.from_pretrained(path)
    except (OSError, ValueError) as err:
        if not local.exists():           # a hub id, not cached, whose download failed
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise PolicyError(missing_model_message(path, f"download failed: {first}")) from None
        raise PolicyError(f"cannot load a processor from {path}: {err}") from None
    tokenizer = getattr(processor, "tokenizer", processor)
    tokenizer.padding_side = "left"
    return processor


def load_family(path: str):
    """The model family of `path`, from its config.json alone (a local dir, the HF cache, else
    the hub's config.json only): an unsupported model is refused here, before any weights
    load, naming the supported families."""
    import transformers

    from mmrlvr import models
    from mmrlvr.config import ConfigError, check_model_path, missing_model_message
    from mmrlvr.config.model_defaults import model_file

    try:
        check_model_path(path)
        if Path(path).exists() or model_file(path, "config.json") is not None:
            return models.resolve(path)
        try:                            # a hub id not cached here: fetch its config.json alone
            config = transformers.AutoConfig.from_pretrained(path)
        except (OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise PolicyError(missing_model_message(path, f"download failed: {first}")) from None
        return models.of_config(config, path)
    except (ConfigError, models.FamilyError) as err:
        raise PolicyError(str(err)) from None


def load_model(path: str, dtype: torch.dtype, attn_implementation: str = "sdpa",
               family=None) -> torch.nn.Module:
    """The model at `path` as its family loads it (an Omni checkpoint: its thinker); `family`:
    the one `load_family` already found."""
    family = family or load_family(path)
    try:
        check_weight_files(path)          # a file cut short: named, not a safetensors traceback
        model = family.load(path, dtype=dtype, attn_implementation=attn_implementation)
        check_finite(model, path)         # NaN/inf weights: refused, naming file and tensor
        return model
    except (OSError, ValueError) as err:
        from mmrlvr.config import missing_model_message

        if not Path(path).exists():      # a hub id, not cached, whose download failed
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise PolicyError(missing_model_message(path, f"download failed: {first}")) from None
        raise PolicyError(f"cannot load the {family.name} model at {path}: {err}") from None


def check_processor(family, processor: Any, path: str) -> None:
    """The processor saved with `path` must feed its model: one error naming both otherwise."""
    import transformers

    from mmrlvr.models import FamilyError

    config = family.unwrap_config(transformers.AutoConfig.from_pretrained(path))
    try:
        family.check_processor(processor, config)
    except FamilyError as err:
        raise PolicyError(f"{path}: {err} (processor {type(processor).__name__})") from None


class Policy:
    """Model + processor + modality adapter on one device."""

    def __init__(self, model: torch.nn.Module, processor: Any, adapter: ModalityAdapter,
                 device: torch.device, lora: bool = False, compute_dtype: torch.dtype | None = None):
        self.model, self.processor, self.adapter = model, processor, adapter
        self.device, self.lora = device, lora
        self.forward_model = model
        """What training forwards run through: the model, or its DDP wrapper."""
        self.compute_dtype = compute_dtype or self.dtype
        """The dtype matrix products run in (`model.dtype`)."""
        self.sharded = False
        """Set when FSDP2 shards the model: it then casts for the forward itself (no autocast),
        and media features are computed inside the model's forward (see mmrlvr.train.parallel)."""
        self.router_aux = False
        """MoE families: training forwards also return the router load-balancing loss, kept in
        `router_losses` for the update to add (`algo.router_aux_coef`)."""
        self.router_losses: list[torch.Tensor] = []
        self.behaviour_template: torch.nn.Module | None = None
        """FSDP2 with one-step-off rollouts: a whole copy taken before sharding, for the
        behaviour model (`mmrlvr.train.async_rollout`, which takes it)."""
        self.packing = False
        """`train.packing`: every `rollout_logprobs` (the update's, the behaviour copy's, each
        method's) runs packed rows (mmrlvr.train.packing), so they all take one path."""
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.family = adapter.family_of(processor)
        """The model family (`mmrlvr.models`): what is particular to this architecture."""
        self.eos_ids = self._eos_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.eos_ids[0]
        self.placeholder_ids = adapter.placeholder_ids(self.tokenizer)
        image = self.family.image_token and self.tokenizer.convert_tokens_to_ids(self.family.image_token)
        self.media_types = {int(image): 1} if image is not None else {}
        """Token id -> type id (`TYPE_KEYS`; images are 1 for Qwen-VL and Gemma 3) of media a tool
        put in a multi-turn completion (a sampled one holds none: placeholders are scrubbed)."""

    @classmethod
    def load(cls, cfg: ModelConfig, adapter: ModalityAdapter, device: torch.device,
             path: str | None = None, adapter_dir: str | Path | None = None) -> "Policy":
        """Load `path` (default `cfg.path`); with LoRA, attach adapters (from `adapter_dir` if given)."""
        path = path or cfg.path
        if not path:
            raise PolicyError("model.path is empty: give a local model dir or hub id")
        family = load_family(path)                  # before anything heavy loads
        wants = getattr(adapter, "feeds", None) or \
            (adapter.name if adapter.name in ("audio", "text") else "vision")
        if family.modality != wants:
            raise PolicyError(f"{path} is a {family.name} model, fed by the {family.modality} "
                              f"modality, not {adapter.name}; set model.modality: {family.modality}")
        processor = load_processor(path)
        check_processor(family, processor, path)
        compute, master = pick_dtype(cfg.dtype, device), DTYPES[cfg.param_dtype]
        # LoRA trains adapters only: the frozen base stays in the compute dtype
        model = load_model(path, compute if cfg.lora.r > 0 else master, cfg.attn_implementation,
                           family)
        frozen = {"vision tower"} if cfg.freeze_vision else set()
        frozen |= {"audio tower"} if cfg.freeze_audio else set()
        frozen |= {"language model"} if cfg.freeze_language else set()
        for name, p in model.named_parameters():
            if family.tower_of(name) in frozen:
                p.requires_grad_(False)
        if not any(p.requires_grad for p in model.parameters()):
            raise PolicyError(f"{path}: model.freeze_vision/freeze_audio/freeze_language leave "
                              f"nothing of this {family.name} model to train")
        adapter.bind(family)
        if cfg.lora.r > 0:
            import warnings

            from peft import LoraConfig, PeftModel, get_peft_model

            with warnings.catch_warnings():     # peft reads transformers' deprecated alias
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                        FutureWarning)
                if adapter_dir is not None:
                    model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
                else:
                    model = get_peft_model(model, LoraConfig(
                        r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                        target_modules=family.lora_modules(cfg.lora.target_modules)),
                        autocast_adapter_dtype=False)
            for p in model.parameters():            # adapters in the master dtype
                if p.requires_grad:
                    p.data = p.data.to(master)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if cfg.lora.r > 0:
                model.enable_input_require_grads()
        model.to(device)
        return cls(model, processor, adapter, device, lora=cfg.lora.r > 0, compute_dtype=compute)

    def _eos_ids(self) -> list[int]:
        ids = []
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        for value in (eos if isinstance(eos, list) else [eos]):
            if value is not None:
                ids.append(int(value))
        for tok in self.family.stop_tokens:
            tid = self.tokenizer.convert_tokens_to_ids(tok)
            if tid is not None and tid != self.tokenizer.unk_token_id and tid not in ids:
                ids.append(int(tid))
        if not ids and self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        return ids

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def base_model(self) -> torch.nn.Module:
        """The transformers model underneath any peft wrapper."""
        return self.model.get_base_model() if self.lora else self.model

    @property
    def attn_implementation(self) -> str:
        """The text model's attention implementation (`sdpa` where the config names none)."""
        config = self.base_model().config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        return getattr(config, "_attn_implementation", None) or "sdpa"

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def autocast(self) -> contextlib.AbstractContextManager:
        """Compute in `compute_dtype` where some weights are held wider (fp32 masters, LoRA
        adapters); FSDP2 casts by itself, and all-bf16 or all-fp32 needs nothing."""
        if self.sharded or all(p.dtype == self.compute_dtype for p in self.model.parameters()):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    @contextlib.contextmanager
    def generation(self):
        """Around `generate` and media encoding for it: eval mode, the compute dtype, and under
        FSDP2 the whole model gathered once."""
        was_training = self.model.training
        self.model.eval()
        try:
            with gathered(self.base_model()), self.autocast():
                yield
        finally:
            self.model.train(was_training)

    def shared_media(self, prompts, prompt_rows: list[int], model: torch.nn.Module | None = None
                     ) -> dict[str, Any] | None:
        """Media features of the distinct prompts among `prompt_rows`, computed once and shared by
        the rows (`Adapter.shared_media`); None under FSDP2, where the model encodes them."""
        if self.sharded:
            return None
        with self.autocast():
            return self.adapter.shared_media(model if model is not None else self.base_model(),
                                             prompts, prompt_rows, self.device, self.dtype)

    def training_inputs(self, inputs: dict[str, torch.Tensor], completion_ids: torch.Tensor,
                        completion_mask: torch.Tensor, model: torch.nn.Module | None = None,
                        media: dict[str, Any] | None = None) -> dict[str, Any]:
        """Forward kwargs for prompt ++ completion ([N, P+C]) on the policy's device, with the
        position ids and, given `media` (`shared_media`), the shared features in place."""
        full = self.adapter.training_inputs(inputs, completion_ids, completion_mask)
        for key in TYPE_KEYS:            # a tool's image inside a multi-turn completion
            if key in full and self.media_types:
                tail = full[key][:, -completion_ids.shape[1]:]
                for token, kind in self.media_types.items():
                    tail.masked_fill_(completion_ids.to(tail.device) == token, kind)
        full = to_device(full, self.device, self.dtype)
        if media is not None:
            full = self.adapter.apply_media(model if model is not None else self.base_model(),
                                            full, media)
        full["position_ids"] = self.adapter.position_ids(self.base_model(), full)
        return full

    def vocab_logprobs(self, full: dict[str, Any], n_completion: int,
                       model: torch.nn.Module | None = None, temperature: float = 1.0,
                       inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """log π over the vocabulary at the last `n_completion` positions of `full`
        (`training_inputs`), at `temperature`. -> [N, C, V] float32.

        The one training forward: GRPO's logprobs, the reference's, PWSD's teacher and student
        and PIRL's perturbed pass all come through here. `model` overrides the network (a
        frozen reference); default `forward_model`. `inputs_embeds` replaces the token
        embeddings (PIRL; the ids stay so media placeholders are still found).
        """
        logits = self.logits(full, n_completion, model, inputs_embeds)
        return F.log_softmax(logits.float() / temperature, dim=-1)            # [N, C, V]

    def _router_kwargs(self) -> dict[str, Any]:
        """`output_router_logits` for a forward that trains (grad on) when the router loss is on."""
        return {"output_router_logits": True} if self.router_aux and torch.is_grad_enabled() else {}

    def _keep_router_loss(self, out: Any) -> None:
        aux = getattr(out, "aux_loss", None)
        if self.router_aux and torch.is_grad_enabled() and aux is not None:
            self.router_losses.append(aux)

    def logits(self, full: dict[str, Any], n_completion: int, model: torch.nn.Module | None = None,
               inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Raw logits [N, C, V] (compute dtype) at the positions that predict the last
        `n_completion` tokens of `full` (`training_inputs`)."""
        C = n_completion
        model = model if model is not None else self.forward_model
        extra = {} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
        extra.update(self._router_kwargs())
        with self.autocast():
            out = model(**full, **extra, use_cache=False, logits_to_keep=C + 1)
        self._keep_router_loss(out)
        # models without `logits_to_keep` (Qwen2-Audio) return every position: keep the last C+1
        return out.logits[:, -(C + 1):-1, :]

    def completion_logprobs(self, inputs: dict[str, torch.Tensor], completion_ids: torch.Tensor,
                            completion_mask: torch.Tensor, temperature: float = 1.0,
                            with_entropy: bool = False, model: torch.nn.Module | None = None,
                            media: dict[str, Any] | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token logprobs [N, C] of `completion_ids` after their prompts `inputs` ([N, P]).

        Logits are divided by the sampling temperature so they score the distribution sampled.
        Returns (logprobs, entropy or None), both [N, C]; padded positions hold garbage (mask them).
        `model` overrides the network (a frozen reference); default `forward_model`. `media`
        replaces the media tensors with precomputed features (`shared_media`).
        """
        full = self.training_inputs(inputs, completion_ids, completion_mask, model, media)
        logits = self.logits(full, completion_ids.shape[1], model)
        return token_logprobs(logits, completion_ids.to(self.device), temperature, with_entropy)

    def rollout_logprobs(self, prompts: PromptBatch, prompt_rows: list[int],
                         completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                         temperature: float = 1.0, with_entropy: bool = False,
                         model: torch.nn.Module | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`completion_logprobs` of completions whose prompts are rows `prompt_rows` of `prompts`.

        The rows of one prompt (a GRPO group) share it: each distinct prompt, media included,
        runs through the model once and its completions attend to that key/value cache; the
        gradients of the copies add up in it, as they would per copy. The same logprobs and
        gradients as whole rows (tests/test_policy.py), on about (P + C)/(P/G + C) fewer
        tokens. Under FSDP2 or gradient checkpointing (no cache in a training forward), and for a
        family whose cache cannot be repeated (`Family.repeatable_cache`), every row runs whole;
        also with the MoE router loss on (`router_aux`: its padding mask must cover every token).
        """
        if self.packing:
            return packed_logprobs(self, prompts, prompt_rows, completion_ids, completion_mask,
                                   temperature, with_entropy, model)
        if self.sharded or self._checkpointing() or completion_ids.shape[1] < 2 \
                or not self.family.repeatable_cache or self.router_aux \
                or self.holds_media(completion_ids):
            inputs, _ = select(prompts, prompt_rows)
            media = self.shared_media(prompts, prompt_rows, model)
            return self.completion_logprobs(inputs, completion_ids, completion_mask, temperature,
                                            with_entropy, model, media)
        with self.autocast():
            logits = self._shared_prompt_logits(prompts, prompt_rows, completion_ids,
                                                completion_mask, model)   # [N, C, V]
        return token_logprobs(logits, completion_ids.to(self.device), temperature, with_entropy)

    def holds_media(self, ids: torch.Tensor) -> bool:
        """Completions with a tool's media (multi-turn): only a whole-row forward places it."""
        held = torch.tensor(self.placeholder_ids, dtype=ids.dtype, device=ids.device)
        return bool(self.placeholder_ids) and bool(torch.isin(ids, held).any())

    def _shared_prompt_logits(self, prompts: PromptBatch, prompt_rows: list[int],
                              ids: torch.Tensor, mask: torch.Tensor,
                              model: torch.nn.Module | None) -> torch.Tensor:
        distinct = list(dict.fromkeys(prompt_rows))                     # U prompts, first-seen
        where = torch.tensor([distinct.index(r) for r in prompt_rows], device=self.device)   # [N]
        inputs, _ = select(prompts, prompt_rows)
        full = self.training_inputs(inputs, ids, mask)                  # positions of whole rows
        P, C = inputs["input_ids"].shape[1], ids.shape[1]
        first = [prompt_rows.index(r) for r in distinct]
        prompt_in, _ = select(prompts, distinct)
        prompt = to_device(prompt_in, self.device, self.dtype)
        media = self.shared_media(prompts, distinct, model)
        if media is not None:
            prompt = self.adapter.apply_media(model if model is not None else self.base_model(),
                                              prompt, media)
        positions = full["position_ids"]
        if positions is not None:        # [3, N, T] (M-RoPE) or [N, T]
            prompt["position_ids"] = positions[..., first, :P] if positions.dim() == 3 \
                else positions[first, :P]
        # the prompt once per distinct prompt: its cache, and the logits of its last position
        out = (model if model is not None else self.base_model())(**prompt, use_cache=True,
                                                                 logits_to_keep=1)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        cache.batch_select_indices(where)                               # U -> N rows
        rest = {"input_ids": full["input_ids"][:, P:P + C - 1],
                "attention_mask": full["attention_mask"][:, :P + C - 1]}
        if positions is not None:
            rest["position_ids"] = positions[..., P:P + C - 1]
        for key in TYPE_KEYS:
            if key in full:
                rest[key] = full[key][:, P:P + C - 1]
        step = (model if model is not None else self.forward_model)(
            **rest, **{self._cache_kwarg(): cache}, use_cache=True,
            cache_position=torch.arange(P, P + C - 1, device=self.device))
        return torch.cat([out.logits[:, -1:][where], step.logits[:, -(C - 1):]], dim=1)

    def _checkpointing(self) -> bool:
        """Gradient checkpointing on (a training forward then keeps no cache)."""
        return bool(self.base_model().is_activation_checkpointing)

    def _cache_kwarg(self) -> str:
        """transformers 5.2x names a forward's cache `cache` (older: `past_key_values`)."""
        params = inspect.signature(type(self.base_model()).forward).parameters
        return "cache" if "cache" in params else "past_key_values"


    def save(self, out_dir: str | Path, main: bool = True) -> Path:
        """Write an HF-loadable model dir (LoRA merged into the weights) with the processor.

        Under FSDP2 every rank must call it (the weights are gathered); `main` writes.
        """
        out_dir = Path(out_dir)
        if self.sharded:
            from mmrlvr.train.parallel import full_state_dict

            state = full_state_dict(self.base_model())
            if main:
                self.base_model().save_pretrained(out_dir, state_dict=state)
                self.processor.save_pretrained(out_dir)
            return out_dir
        if not main:
            return out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.lora:
            base = self.model.get_base_model()
            base.save_pretrained(out_dir, state_dict=self._merged_state(base))
            self.model.save_pretrained(out_dir / "adapter")
        else:
            self.model.save_pretrained(out_dir)
        self.processor.save_pretrained(out_dir)
        return out_dir

    @staticmethod
    def _merged_state(base: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The base model's state with each LoRA delta added in fp32 (the live weights are left
        alone: merging into bf16 weights and unmerging again would round them)."""
        state = {}
        for name, module in base.named_modules():
            if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight"):
                weight = module.base_layer.weight
                delta = sum(module.get_delta_weight(a).float() for a in module.active_adapters)
                state[f"{name}.weight"] = (weight.detach().float() + delta).to(weight.dtype).cpu()
        for key, value in base.state_dict().items():
            if "lora_" not in key:
                state.setdefault(key.replace(".base_layer.", "."), value.detach().cpu())
        return state
