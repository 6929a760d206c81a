"""Stress operators: seeded rewrites of one example that keep (or knowingly change) its task.

An operator maps (example, the clean format instruction, seed) to a `Variant` (the rewritten
example and the format instruction to use), or to None where it does not apply (an option
shuffle on a yes/no question). Three kinds, reported apart (docs/methods.md, "PIRL"):

    text    meaning-preserving prompt changes; their mean drop is the robustness figure
    image   pixel changes that leave the finding readable
    task    task-altering changes (multiple choice -> free form); never in the robustness figure

(`ops_audio` and `ops_video` add the kinds `audio` and `video`; `frame_order`, a video operator,
rewrites the gold where the row says what it becomes, `Operator.changes_gold`.)

Text and image operators keep the gold valid: where options move, the gold letter is remapped
(`gold_preserved` checks it). Every choice an operator makes (template, permutation, sentence,
noise) is drawn from a generator seeded by (seed, operator, example id), so a stress run repeats.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import random
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

from mmrlvr.data import Example
from mmrlvr.core.templates import HELDOUT_TEMPLATES, render, split_options, with_options

PARAPHRASES: list[tuple[str, str, str, str]] = [
    # (pattern, replacement, reviewed example in, reviewed example out); first match wins
    (r"Is there (an?|any) (.+?) in (the|this) (.+?)\?", r"Does \3 \4 contain \1 \2?",
     "Is there a nodule in the left lung?", "Does the left lung contain a nodule?"),
    (r"Is there (an?|any) (.+?)\?", r"Can \1 \2 be seen?",
     "Is there a fracture?", "Can a fracture be seen?"),
    (r"Are there (.+?)\?", r"Can \1 be seen?",
     "Are there multiple lesions?", "Can multiple lesions be seen?"),
    (r"Is this (an?) (.+?)\?", r"Is this image \1 \2?", "Is this a CT scan?", "Is this image a CT scan?"),
    (r"Are the (.+?) normal\?", r"Do the \1 look normal?", "Are the lungs normal?",
     "Do the lungs look normal?"),
    (r"Is the (.+?) normal\?", r"Does the \1 look normal?", "Is the brain normal?",
     "Does the brain look normal?"),
    (r"(?:Which|What) organ is (?:shown|imaged|visualized|seen)(?: in this image)?\?",
     "What organ does this image show?", "Which organ is shown?", "What organ does this image show?"),
    (r"What (?:imaging )?modality (?:is this|was used|is used)\?",
     "Which imaging technique was used to acquire this image?", "What imaging modality is this?",
     "Which imaging technique was used to acquire this image?"),
    (r"In (?:which|what) plane is this image (?:taken|acquired)\?",
     "What is the imaging plane of this image?", "In which plane is this image taken?",
     "What is the imaging plane of this image?"),
    (r"(?:Which|What) plane is this(?: image)?\?", "In which plane was this image acquired?",
     "Which plane is this?", "In which plane was this image acquired?"),
    (r"Which side is the (.+?) on\?", r"On which side is the \1?", "Which side is the nodule on?",
     "On which side is the nodule?"),
    (r"Where is the (.+?)(?: located)?\?", r"What is the location of the \1?",
     "Where is the lesion?", "What is the location of the lesion?"),
    (r"How large is the (.+?)\?", r"What is the size of the \1?", "How large is the nodule?",
     "What is the size of the nodule?"),
    (r"How many (.+?) are (?:there|present|seen) in (the|this) (.+?)\?",
     r"What is the number of \1 in \2 \3?", "How many nodules are there in the image?",
     "What is the number of nodules in the image?"),
    (r"How many (.+?) are (?:there|present|seen)\?", r"What is the number of \1?",
     "How many nodules are there?", "What is the number of nodules?"),
    (r"What is (?:shown|seen) in (the|this) (.+?)\?", r"What does \1 \2 show?",
     "What is shown in this image?", "What does this image show?"),
]
"""The reviewed paraphrase list: each rule with the example it was checked on (tests run them)."""
_RULES = [(re.compile(p, re.IGNORECASE), r) for p, r, _, _ in PARAPHRASES]

FORMAT_INSTRUCTIONS = (
    "Output the thinking process in <think> </think> and the final answer in <answer> </answer> tags.",
    "First reason inside <think> </think> tags, then write only the final answer inside "
    "<answer> </answer> tags.",
    "Put the final answer in <answer> </answer>.",
)
"""Equivalent answer-format instructions; the format operator swaps in one the run did not use."""

IRRELEVANT_CONTEXT = (
    "The study was requested by the outpatient clinic.",
    "The images were archived in the hospital system yesterday.",
    "The patient's appointment was rescheduled once.",
    "This image was selected from a teaching file.",
)
"""Sentences with no bearing on any image finding, prepended by the context operator."""


@dataclass
class Variant:
    example: Example
    format_prompt: str


@dataclass(frozen=True)
class Operator:
    name: str
    kind: str
    """`text`, `image` or `task` (task-altering)."""
    doc: str
    fn: Callable[[Example, str, random.Random], Variant | None]
    changes_gold: bool = False
    """It knowingly rewrites the gold (`frame_order`: a reversed clip moves the other way), so
    `apply` does not hold it to `gold_preserved`; task operators never are."""


def _rng(seed: int, op: str, ex_id: str) -> random.Random:
    return random.Random(hashlib.sha1(f"{seed}|{op}|{ex_id}".encode()).hexdigest())


def gold_index(ex: Example) -> int | None:
    """The index of the correct option (gold given as a letter or as an option's text)."""
    if not ex.choices:
        return None
    g = ex.answer.strip().strip("().").strip()
    if len(g) == 1 and g.isalpha() and ord(g.upper()) - 65 < len(ex.choices):
        return ord(g.upper()) - 65
    folded = [c.strip().casefold() for c in ex.choices]
    return folded.index(ex.answer.strip().casefold()) if ex.answer.strip().casefold() in folded else None


def gold_preserved(orig: Example, new: Example) -> bool:
    """Whether `new` asks for the same answer: the same option text, or the same gold."""
    if orig.choices:
        i, j = gold_index(orig), gold_index(new)
        return i is not None and j is not None and bool(new.choices) \
            and orig.choices[i] == new.choices[j]
    return new.answer == orig.answer and not new.choices


def paraphrase(question: str) -> str | None:
    """The first reviewed rule's rewrite of a whole one-line question, or None if none applies."""
    q = question.strip()
    for pattern, repl in _RULES:
        if pattern.fullmatch(q):
            return pattern.sub(repl, q, count=1)
    return None


# -- text operators -------------------------------------------------------------------------
def op_template_swap(ex, fmt, rng):
    return Variant(dataclasses.replace(ex, prompt=render(rng.choice(HELDOUT_TEMPLATES), ex.prompt)), fmt)


def op_paraphrase(ex, fmt, rng):
    stem, listed = split_options(ex.prompt, ex.choices)
    new = paraphrase(stem)
    if new is None:
        return None
    return Variant(dataclasses.replace(ex, prompt=with_options(new, ex.choices) if listed else new), fmt)


def op_option_shuffle(ex, fmt, rng):
    stem, listed = split_options(ex.prompt, ex.choices)
    i = gold_index(ex)
    if not listed or i is None or len(ex.choices) < 2:
        return None
    order = list(range(len(ex.choices)))
    while order.index(i) == i:                      # the correct option must move
        rng.shuffle(order)
    choices = [ex.choices[k] for k in order]
    is_letter = ex.answer.strip().casefold() != ex.choices[i].strip().casefold()
    answer = chr(65 + order.index(i)) if is_letter else ex.answer
    return Variant(dataclasses.replace(ex, prompt=with_options(stem, choices), choices=choices,
                                       answer=answer), fmt)


def op_option_relabel(ex, fmt, rng):
    stem, listed = split_options(ex.prompt, ex.choices)
    if not listed:
        return None
    inline = "; ".join(f"({chr(65 + k)}) {c}" for k, c in enumerate(ex.choices))
    return Variant(dataclasses.replace(ex, prompt=f"{stem}\nOptions: {inline}"), fmt)


def op_format_instruction(ex, fmt, rng):
    return Variant(ex, rng.choice([f for f in FORMAT_INSTRUCTIONS if f != fmt.strip()]))


def op_irrelevant_context(ex, fmt, rng):
    return Variant(dataclasses.replace(ex, prompt=f"{rng.choice(IRRELEVANT_CONTEXT)} {ex.prompt}"), fmt)


# -- task-altering --------------------------------------------------------------------------
def op_mc_to_open(ex, fmt, rng):
    stem, listed = split_options(ex.prompt, ex.choices)
    i = gold_index(ex)
    if not listed or i is None:
        return None
    return Variant(dataclasses.replace(ex, prompt=stem, choices=None, answer=ex.choices[i],
                                       meta={**ex.meta, "answer_type": "open"}), fmt)


# -- image operators ------------------------------------------------------------------------
def _load(image) -> Image.Image:
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    with Image.open(image) as fh:
        return fh.convert("RGB")


def _image_op(transform: Callable[[Image.Image, random.Random], Image.Image]):
    def fn(ex, fmt, rng):
        if not ex.images:
            return None
        return Variant(dataclasses.replace(ex, images=[transform(_load(im), rng) for im in ex.images]), fmt)
    return fn


def _noise(img, rng, sigma=12.0):
    arr = np.asarray(img, dtype=np.float32)
    arr = arr + np.random.default_rng(rng.randrange(2 ** 32)).normal(0.0, sigma, arr.shape)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _jpeg(img, rng, quality=20):
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    buf.seek(0)
    return Image.open(buf).convert("RGB")


def _crop(img, rng, frac=0.08):
    w, h = img.size
    dx, dy = int(w * frac), int(h * frac)
    return img.crop((dx, dy, w - dx, h - dy)).resize((w, h), Image.Resampling.BICUBIC)


def _tone(img, rng):
    return ImageEnhance.Contrast(ImageEnhance.Brightness(img).enhance(1.25)).enhance(0.75)


TEXT_AND_IMAGE: dict[str, Operator] = {op.name: op for op in [
    Operator("template_swap", "text", "prompt wrapped in a held-out template", op_template_swap),
    Operator("paraphrase", "text", "question rewritten by a reviewed rule", op_paraphrase),
    Operator("option_shuffle", "text", "options permuted, gold letter remapped", op_option_shuffle),
    Operator("option_relabel", "text", "options listed inline as (A) ...; (B) ...", op_option_relabel),
    Operator("format_instruction", "text", "an equivalent answer-format instruction",
             op_format_instruction),
    Operator("irrelevant_context", "text", "an irrelevant sentence prepended", op_irrelevant_context),
    Operator("gaussian_noise", "image", "Gaussian noise, sd 12 grey levels", _image_op(_noise)),
    Operator("blur", "image", "Gaussian blur, radius 1% of the image side",
             _image_op(lambda im, r: im.filter(ImageFilter.GaussianBlur(max(0.5, 0.01 * min(im.size)))))),
    Operator("jpeg", "image", "JPEG re-encoding at quality 20", _image_op(_jpeg)),
    Operator("brightness_contrast", "image", "brightness x1.25, contrast x0.75", _image_op(_tone)),
    Operator("rotate", "image", "5 degree rotation",
             _image_op(lambda im, r: im.rotate(5, resample=Image.Resampling.BILINEAR))),
    Operator("crop", "image", "8% border crop, resized back", _image_op(_crop)),
    Operator("mc_to_open", "task", "options removed: multiple choice becomes free form",
             op_mc_to_open),
]}
"""The prompt and image operators by name, in report order (`mmrlvr.stress.OPERATORS` adds the
audio ones)."""


def apply(op: Operator, ex: Example, format_prompt: str, seed: int = 0) -> Variant | None:
    """`op` on `ex` with its own seeded generator; None where the operator does not apply."""
    variant = op.fn(ex, format_prompt, _rng(seed, op.name, ex.id))
    if variant is not None and op.kind != "task" and not op.changes_gold \
            and not gold_preserved(ex, variant.example):
        raise AssertionError(f"stress operator {op.name} broke the gold of sample {ex.id}")
    return variant
