"""Image-translation adapter (TransAnyText): the VLM reads an image and writes an HTML patch.

Student prompt: the image + the target language (`instruction`). Privileged teacher prompt
(PWSD, `mmrlvr.methods.transanytext.pwsd`): the same image and instruction plus the source-language patch
(`meta.source_patch`), so the teacher knows the text, boxes and styles it must carry over and
only has to translate. Everything else — image loading, resizing, media slicing, token-count
checks — is the vision adapter's.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from mmrlvr.data import DataError, Example
from mmrlvr.core.types import PromptBatch
from modalities.vision import VisionAdapter

LANGUAGES: dict[str, str] = {"en": "English", "de": "German", "fr": "French", "es": "Spanish",
                             "ru": "Russian", "el": "Greek"}
"""Language codes the prompts know by name (others are named by their code)."""


def language_name(code: str) -> str:
    return LANGUAGES.get(code, code)


def instruction(target: str, source: str | None = None, compact: bool = False) -> str:
    """The student's task text for translating an image's text into `target` (`compact`: ask
    for the compact `<p x= y= w= h= s=>` form of `mmrlvr.patches.schema`)."""
    src = f" from {language_name(source)}" if source else ""
    if compact:      # short, and the language last: a tiny model attends to the recent tokens
        return (f"Write a compact HTML patch (one <p> per text box: x, y, w, h, size, font, "
                f"weight, colour, alignment) with the image's text{src} in {language_name(target)}.")
    return (f"Translate the text in the image{src} into {language_name(target)}. Answer with an "
            "HTML patch: one <div> per text box with its left, top, width, height, font, size, "
            "weight, colour and alignment.")


def privileged_prompt(example: Example) -> str:
    """The teacher's prompt: the student's, plus the source-language patch it may read."""
    source = example.meta.get("source_patch")
    if not source:
        raise DataError(f"sample {example.id}: PWSD needs meta.source_patch (the source-language "
                        "HTML patch) for the teacher's privileged prompt")
    return f"{example.prompt}\nSource-language patch:\n{source}"


def privileged_example(example: Example) -> Example:
    """The example as PWSD's teacher sees it: the same image, `privileged_prompt` as the prompt."""
    return dataclasses.replace(example, prompt=privileged_prompt(example))


def make_example(image: Any, target: str, *, source: str | None = None,
                 id: str = "image") -> Example:
    """An Example for translating one image (a path or PIL image) into `target`."""
    return Example(id=id, prompt=instruction(target, source), answer="-", images=[image],
                   meta={"target_lang": target, **({"source_lang": source} if source else {})})


class ImageTranslationAdapter(VisionAdapter):
    name = "image_translation"

    def privileged_example(self, example: Example) -> Example:
        """The same image with `privileged_prompt` (the source-language patch) as the prompt:
        what a privileged teacher reads (TransAnyText's PWSD, OPDVR's `privileged` teacher).
        Only this modality has one; callers ask `hasattr(adapter, "encode_privileged")`."""
        return privileged_example(example)

    def encode_privileged(self, examples: list[Example], processor: Any,
                          **options: Any) -> PromptBatch:
        """`encode` of the privileged examples; the batch keeps the original examples (rewards
        and ids stay the student's)."""
        batch = self.encode([self.privileged_example(ex) for ex in examples], processor, **options)
        batch.examples = list(examples)
        return batch
