"""Text adapter: prompts without media, for a text-only language model (`mmrlvr.models.llama`).

The vision and audio adapters feed text-only rows too, but through a multimodal processor whose
chat template takes a message's content as a list of typed parts. A text-only checkpoint's
tokenizer (SmolLM2's, Llama's) has a template that concatenates `message['content']` as a
string, so here every turn's content is the plain string, the template is the tokenizer's own,
and the tokenizer (the model dir's "processor") tokenises the batch once. A row with an image, an
audio clip or a video is refused, naming the sample: a text model would silently ignore it.
"""
from __future__ import annotations

from typing import Any

from mmrlvr.core.types import PromptBatch
from mmrlvr.data import DataError, Example
from modalities.base import Adapter


class TextAdapter(Adapter):
    name = "text"
    media_keys = ()

    def __init__(self, **options: Any):
        # the trainer passes every adapter its pixel bounds and video settings: none apply here
        super().__init__(**options)

    def build_messages(self, example: Example, system_prompt: str = "",
                       format_prompt: str = "") -> list[dict[str, Any]]:
        """The run's (or the row's) system turn and one user turn, each content a string."""
        media = [(kind, len(items)) for kind, items in (
            ("image", example.images), ("audio clip", example.audios), ("video", example.videos))
            if items]
        if media:
            what = ", ".join(f"{n} {kind}(s)" for kind, n in media)
            family = self.family.name if self.family is not None else "text-only"
            raise DataError(f"sample {example.id}: {what}, but the {family} model reads text only; "
                            "drop the row's media (or the row), or train a vision- or "
                            "audio-language model on it")
        messages = self.chat([], example, system_prompt, format_prompt)
        return [{"role": m["role"], "content": "".join(part["text"] for part in m["content"])}
                for m in messages]

    def encode(self, examples: list[Example], processor: Any, system_prompt: str = "",
               format_prompt: str = "", **_: Any) -> PromptBatch:
        self.family_of(processor)
        tokenizer = getattr(processor, "tokenizer", processor)
        texts = [tokenizer.apply_chat_template(self.build_messages(ex, system_prompt, format_prompt),
                                               tokenize=False, add_generation_prompt=True)
                 for ex in examples]
        # the chat template writes every special token itself: add none again
        inputs = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        inputs = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask")}
        return PromptBatch(list(examples), inputs, [{} for _ in examples], texts,
                           {"system_prompt": system_prompt, "format_prompt": format_prompt})
