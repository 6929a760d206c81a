"""The policy: a model and its processor, loaded from a local dir or hub id, with optional LoRA.

It computes per-token logprobs of completions given their (un-expanded) prompts, in
micro-batches, and saves itself as an HF-loadable model dir (LoRA merged on save).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mmrlvr.config import ModelConfig
from modalities.base import Adapter, to_device


class PolicyError(RuntimeError):
    """A model dir that cannot be loaded as configured; the message says what is missing."""


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise PolicyError("train.device is 'cuda' but no CUDA device is visible")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_processor(path: str) -> Any:
    from transformers import AutoProcessor

    local = Path(path)
    if local.exists() and not any((local / f).exists() for f in (
            "processor_config.json", "preprocessor_config.json", "tokenizer_config.json")):
        raise PolicyError(f"model dir {local} has no processor (no processor_config.json, "
                          "preprocessor_config.json or tokenizer_config.json); save the processor "
                          "with the model, e.g. processor.save_pretrained(dir)")
    try:
        processor = AutoProcessor.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise PolicyError(f"cannot load a processor from {path}: {err}") from None
    tokenizer = getattr(processor, "tokenizer", processor)
    tokenizer.padding_side = "left"
    return processor


def load_model(path: str, dtype: torch.dtype, attn_implementation: str = "sdpa") -> torch.nn.Module:
    """Load through `AutoModelForImageTextToText`, else the class the config's architectures name."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise PolicyError(f"cannot load a model config from {path}: {err}") from None
    kwargs = {"dtype": dtype, "attn_implementation": attn_implementation}
    try:
        return transformers.AutoModelForImageTextToText.from_pretrained(path, **kwargs)
    except ValueError:
        names = getattr(config, "architectures", None) or []
        if getattr(config, "model_type", "") == "qwen2_5_omni":   # full Omni: train its text thinker
            names = ["Qwen2_5OmniThinkerForConditionalGeneration"]
        model_cls = getattr(transformers, names[0], None) if names else None
        if model_cls is None:
            raise PolicyError(f"{path}: no image/audio-text model class for config "
                              f"{type(config).__name__} (architectures: {names})") from None
        return model_cls.from_pretrained(path, **kwargs)


class Policy:
    """Model + processor + modality adapter on one device."""

    def __init__(self, model: torch.nn.Module, processor: Any, adapter: Adapter,
                 device: torch.device, lora: bool = False):
        self.model, self.processor, self.adapter = model, processor, adapter
        self.device, self.lora = device, lora
        self.forward_model = model
        """What training forwards run through: the model, or its DDP wrapper under accelerate."""
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.eos_ids = self._eos_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.eos_ids[0]
        self.placeholder_ids = adapter.placeholder_ids(self.tokenizer)

    @classmethod
    def load(cls, cfg: ModelConfig, adapter: Adapter, device: torch.device,
             path: str | None = None, adapter_dir: str | Path | None = None) -> "Policy":
        """Load `path` (default `cfg.path`); with LoRA, attach adapters (from `adapter_dir` if given)."""
        path = path or cfg.path
        if not path:
            raise PolicyError("model.path is empty: give a local model dir or hub id")
        processor = load_processor(path)
        model = load_model(path, pick_dtype(cfg.dtype, device), cfg.attn_implementation)
        if cfg.freeze_vision:
            for name, p in model.named_parameters():
                if ".visual." in f".{name}" or name.startswith("visual."):
                    p.requires_grad_(False)
        if cfg.freeze_audio:
            for name, p in model.named_parameters():
                if ".audio_tower." in f".{name}":
                    p.requires_grad_(False)
        if cfg.lora.r > 0:
            from peft import LoraConfig, PeftModel, get_peft_model

            if adapter_dir is not None:
                model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
            else:
                model = get_peft_model(model, LoraConfig(
                    r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                    target_modules=cfg.lora.target_modules))
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if cfg.lora.r > 0:
                model.enable_input_require_grads()
        model.to(device)
        return cls(model, processor, adapter, device, lora=cfg.lora.r > 0)

    def _eos_ids(self) -> list[int]:
        ids = []
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        for value in (eos if isinstance(eos, list) else [eos]):
            if value is not None:
                ids.append(int(value))
        for tok in ("<|im_end|>", "<|endoftext|>"):
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

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def completion_logprobs(self, inputs: dict[str, torch.Tensor], completion_ids: torch.Tensor,
                            completion_mask: torch.Tensor, temperature: float = 1.0,
                            with_entropy: bool = False, model: torch.nn.Module | None = None,
                            media: dict[str, Any] | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token logprobs [N, C] of `completion_ids` after their prompts `inputs` ([N, P]).

        Logits are divided by the sampling temperature so they score the distribution sampled.
        Returns (logprobs, entropy or None), both [N, C]; padded positions hold garbage (mask them).
        `model` overrides the network (a frozen reference); default `forward_model`. `media`
        replaces the media tensors with precomputed features (`Adapter.shared_media`).
        """
        full = self.adapter.training_inputs(inputs, completion_ids, completion_mask)
        full = to_device(full, self.device, self.dtype)
        if media is not None:
            full = self.adapter.apply_media(model if model is not None else self.base_model(),
                                            full, media)
        position_ids = self.adapter.position_ids(self.base_model(), full)
        C = completion_ids.shape[1]
        model = model if model is not None else self.forward_model
        out = model(**full, position_ids=position_ids, use_cache=False, logits_to_keep=C + 1)
        # models without `logits_to_keep` (Qwen2-Audio) return every position: keep the last C+1
        logits = out.logits[:, -(C + 1):-1, :].float() / temperature          # [N, C, V]
        logp_all = F.log_softmax(logits, dim=-1)                               # [N, C, V]
        ids = completion_ids.to(self.device).unsqueeze(-1)                     # [N, C, 1]
        logp = logp_all.gather(-1, ids).squeeze(-1)                            # [N, C]
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = -(logp_all.exp() * logp_all).sum(-1)                 # [N, C]
        return logp, entropy

    def save(self, out_dir: str | Path) -> Path:
        """Write an HF-loadable model dir (LoRA merged into the weights) with the processor."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.lora:
            self.model.merge_adapter()
            try:
                base = self.model.get_base_model()
                state = {k.replace(".base_layer.", "."): v.detach().cpu()
                         for k, v in base.state_dict().items() if "lora_" not in k}
                base.save_pretrained(out_dir, state_dict=state)
            finally:
                self.model.unmerge_adapter()
            self.model.save_pretrained(out_dir / "adapter")
        else:
            self.model.save_pretrained(out_dir)
        self.processor.save_pretrained(out_dir)
        return out_dir
