"""Robustness: one sample through every stress operator; answers in a table, flips marked.

Operators are small, deterministic and meaning-preserving: image ones (Gaussian noise, blur,
darker, brighter, rotation) act on the image the model sees (after resizing to the adapter's
min/max pixels); text ones rewrite the question (a paraphrase, a change of question format).
Every variant is answered greedily in one batch by the `hf` rollout engine. A *flip* is a variant
whose extracted answer differs from the clean one's (compared by `rewards.verify.match`). The
`mmrlvr stress` command will share these operators once it lands.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter, ImageStat

from apps.common import DemoContext, UserError, check_question, explain, prepare_images, warn
from mmrlvr.data import Example
from rewards.verify import extract_answer, match

TABLE_HEADERS = ["operator", "kind", "question", "answer", "correct", "flip", "completion"]


def gaussian_noise(img: Image.Image, sigma: float = 25.0, seed: int = 0) -> Image.Image:
    """Additive N(0, sigma²) noise per channel on the 0-255 scale; seeded, so repeatable."""
    arr = np.asarray(img, dtype=np.float32)
    noisy = arr + np.random.default_rng(seed).normal(0.0, sigma, arr.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def blur(img: Image.Image, radius: float = 2.0) -> Image.Image:
    return img.filter(ImageFilter.GaussianBlur(radius))


def darker(img: Image.Image, factor: float = 0.5) -> Image.Image:
    return ImageEnhance.Brightness(img).enhance(factor)


def brighter(img: Image.Image, factor: float = 1.5) -> Image.Image:
    return ImageEnhance.Brightness(img).enhance(factor)


def rotate(img: Image.Image, degrees: float = 15.0) -> Image.Image:
    """Rotate in place (same size); the uncovered corners take the image's mean colour."""
    fill = tuple(int(v) for v in ImageStat.Stat(img).mean[:3])
    return img.rotate(degrees, resample=Image.Resampling.BILINEAR, fillcolor=fill)


_PARAPHRASES: list[tuple[re.Pattern, str]] = [
    (re.compile(pattern, re.IGNORECASE), template) for pattern, template in [
        (r"^how many (.+?) (?:are|is) there\??$", r"What is the number of \1?"),
        (r"^how many (.+?) (?:are|is) (in|on) (.+?)\??$", r"What is the number of \1 \2 \3?"),
        (r"^is there (.+?) in the (image|picture)\??$", r"Does the \2 contain \1?"),
        (r"^what colou?r is (.+?)\??$", r"Which colour is \1?"),
        (r"^what (.+?) is in the (image|picture)\??$", r"Which \1 does the \2 show?"),
    ]
]


def paraphrase(question: str) -> str:
    """The same question in other words: a rewrite rule where one fits, else a lead-in phrase."""
    q = question.strip()
    for pattern, template in _PARAPHRASES:
        if pattern.match(q):
            return pattern.sub(template, q)
    return f"Looking at the image, answer this question: {q[:1].lower()}{q[1:]}"


def question_format(question: str) -> str:
    """The same question in another layout: a `Question:` label with the text on its own line."""
    return f"Question:\n{question.strip()}"


IMAGE_OPS: dict[str, Callable[[Image.Image], Image.Image]] = {
    "gaussian_noise": gaussian_noise, "blur": blur, "darker": darker, "brighter": brighter,
    "rotate": rotate}
TEXT_OPS: dict[str, Callable[[str], str]] = {"paraphrase": paraphrase, "format": question_format}


def variants(images: list[Image.Image], question: str) -> list[tuple[str, str, list, str]]:
    """(operator, kind, images, question) for the clean sample and every operator."""
    out = [("clean", "-", images, question)]
    out += [(name, "image", [op(img) for img in images], question)
            for name, op in IMAGE_OPS.items()]
    out += [(name, "text", images, op(question)) for name, op in TEXT_OPS.items()]
    return out


def _same(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return match(a, b) or match(b, a)


def table(cases: list[tuple[str, str, str]], texts: list[str], gold: str = ""
          ) -> tuple[list[list[Any]], int]:
    """Table rows for (operator, kind, question) cases and their completions (clean first),
    and how many flipped."""
    answers = [extract_answer(t) for t in texts]
    rows, flips = [], 0
    for (name, kind, q), text, ans in zip(cases, texts, answers):
        flipped = name != "clean" and not _same(ans, answers[0])
        flips += flipped
        correct = ("✓" if ans is not None and match(ans, gold) else "✗") if gold else ""
        rows.append([name, kind, q, ans if ans is not None else "(none)", correct,
                     "⚠ flip" if flipped else "", text[:120]])
    return rows, flips


def run(ctx: DemoContext, files: Any, question: str, gold: str = "",
        max_new_tokens: int = 64) -> tuple[list[list[Any]], list[tuple[Image.Image, str]], str]:
    """The Robustness handler: (table rows, images with captions, status); never raises."""
    reason = ctx.unavailable("vision", "Robustness")
    if reason:
        return [], [], reason
    try:
        from mmrlvr.rollout import SamplingParams, make_engine

        policy = ctx.policy
        question = check_question(question)
        images, _ = prepare_images(policy, files)
        gold = (gold or "").strip()
        cases = variants(images, question)
        examples = [Example(id=name, prompt=q, answer=gold or "-", images=imgs)
                    for name, _, imgs, q in cases]
        with ctx.lock:
            batch = policy.adapter.encode(examples, policy.processor,
                                          system_prompt=ctx.system_prompt,
                                          format_prompt=ctx.format_prompt)
            out = make_engine("hf", policy).generate(
                batch, SamplingParams(max_new_tokens=int(max_new_tokens), greedy=True))
        rows, flips = table([(name, kind, q) for name, kind, _, q in cases], out.texts, gold)
        gallery = [(imgs[0], name) for name, kind, imgs, _ in cases if kind in ("-", "image")]
        status = (f"✓ {len(cases) - 1} operators, {flips} flipped the clean answer "
                  f"(clean answer: {rows[0][3]}).")
        return rows, gallery, status
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        message = explain(err)
        if not isinstance(err, UserError):
            warn(message)
        return [], [], message


def build(ctx: DemoContext) -> None:
    import gradio as gr

    reason = ctx.unavailable("vision", "Robustness")
    if reason:
        gr.Markdown(f"**{reason}**")
    gr.Markdown("One sample through every stress operator: "
                f"image — {', '.join(IMAGE_OPS)}; text — {', '.join(TEXT_OPS)}. "
                "Greedy answers; a flip is an answer that differs from the clean one.")
    with gr.Row():
        with gr.Column(scale=1):
            image = gr.File(label="image", file_types=["image"], elem_id="robust-file")
            question = gr.Textbox(label="question", lines=2)
            gold = gr.Textbox(label="gold answer (optional)")
            max_new = gr.Slider(8, 1024, value=64, step=8, label="max new tokens")
            submit = gr.Button("Run every operator", variant="primary",
                               interactive=reason is None)
        with gr.Column(scale=2):
            status = gr.Markdown()
            table = gr.Dataframe(headers=TABLE_HEADERS, label="answers", interactive=False,
                                 wrap=True, max_height=600,
                                 column_widths=["13%", "7%", "25%", "13%", "8%", "8%", "26%"])
            gallery = gr.Gallery(label="what the model saw", columns=6, height=200,
                                 object_fit="contain")

    def on_run(image, question, gold, max_new):
        return run(ctx, image, question, gold, max_new)

    submit.click(on_run, [image, question, gold, max_new], [table, gallery, status],
                 api_name="robustness")
