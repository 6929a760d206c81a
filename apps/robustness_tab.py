"""Robustness: one sample through every stress operator that applies; rows fill in as they finish.

The operators are the library's (`mmrlvr.stress.OPERATORS`, the ones `mmrlvr stress` uses),
applied with `stress.apply(op, example, format_prompt, seed)`. Only the loaded modality's kinds
are offered (an image model: text, image and task-altering operators; an audio model: text, audio
and task-altering); of those, the ones that do not apply to this sample (a `None` variant: option
operators without options, no reviewed paraphrase rule) are named with the reason. Media
operators act on what the model sees (the image after resizing to the adapter's bounds). Each
variant is answered greedily with the `hf` rollout engine's prompt and suppression
(`apps.generate.stream_completion`), one at a time, so the table grows row by row; the status
counts each answer's tokens as they come, and a client that leaves stops the run within a token
(Gradio closes the handler at its next update). A *flip* is a variant whose extracted answer
differs from the clean one's (compared by `rewards.verify.match`; with options, a letter counts as
its option's text, so a shuffle that moves the chosen option is no flip). The held-out prompt
templates and the irrelevant sentences of `mmrlvr.stress` are medical; for other data the demo
draws them from `DOMAIN_TEXT` instead.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import closing
from typing import Any

from apps.common import (MAX_GOLD_CHARS, MAX_OPTIONS_CHARS, MAX_QUESTION_CHARS, DemoContext,
                         UserError, check_question, check_text, explain, prepare_images, warn)
from apps.generate import stream_completion
from apps.runinfo import question_domain
from mmrlvr.core.templates import render, split_options, with_options
from mmrlvr.data import Example
from mmrlvr.stress import OPERATORS, Operator, Variant, apply, gold_index
from rewards.verify import extract_answer, match

TABLE_HEADERS = ["operator", "kind", "question", "answer", "correct", "flip", "completion"]
KIND_LABELS = {"text": "text", "image": "image", "audio": "audio", "task": "task-altering"}
KINDS = {"vision": ("text", "image", "task"), "audio": ("text", "audio", "task")}
SEED = 0
MAX_CHOICES = 26
_LABEL = re.compile(r"^\(?([A-Za-z])[.)]\s+")
DOMAIN_TEXT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "image": (("Examine the image carefully before answering. {question}",
               "Here is a question about the picture. {question}"),
              ("This picture was drawn for a quiz.", "The file was saved yesterday.")),
    "audio": (("Listen to the clip carefully before answering. {question}",
               "Here is a question about the recording. {question}"),
              ("This clip was recorded for a quiz.", "The file was saved yesterday.")),
}
"""Held-out templates (none a training one; the first image one is the library's only
domain-free one) and irrelevant sentences for non-medical samples, by media kind."""
WHY_NOT = {"paraphrase": "no reviewed rewrite rule matches the question",
           "option_shuffle": "needs options and a gold answer",
           "option_relabel": "needs options", "mc_to_open": "needs options and a gold answer"}


def parse_choices(choices: Any) -> list[str] | None:
    """Options typed one per line (a leading `A.` / `(A)` label of their own letter dropped);
    None when there are none."""
    if isinstance(choices, str):
        choices = choices.splitlines()
    out = []
    for i, c in enumerate(c for c in (str(c).strip() for c in (choices or [])) if c):
        m = _LABEL.match(c)
        if m and m.group(1).upper() == chr(65 + i) and c[m.end():].strip():
            c = c[m.end():].strip()
        out.append(c)
    if not out:
        return None
    if len(out) < 2:
        raise UserError("List at least two options (one per line), or none.")
    if len(out) > MAX_CHOICES:
        raise UserError(f"{len(out)} options listed; at most {MAX_CHOICES} (A–Z).")
    return out


def make_example(media: list[Any], question: str, gold: str = "",
                 choices: list[str] | None = None, audio: bool = False) -> Example:
    """The clean sample: options listed under the question as training and `mmrlvr stress` do."""
    ex = Example(id="demo", prompt=with_options(question, choices), answer=gold or "-",
                 choices=choices, **{"audios" if audio else "images": list(media)})
    if choices and gold_index(ex) is None:
        raise UserError("With options, give the gold answer as an option's letter or its text "
                        f"(got {gold!r}).")
    return ex


def domain_operators(domain: str, media: str) -> dict[str, Operator]:
    """`template_swap` and `irrelevant_context` drawing from text that fits the sample's domain
    (the library's own for medical samples)."""
    if domain == "medical":
        return {}
    templates, sentences = DOMAIN_TEXT[media]

    def swap(ex, fmt, rng):
        return Variant(dataclasses.replace(ex, prompt=render(rng.choice(templates), ex.prompt)),
                       fmt)

    def context(ex, fmt, rng):
        return Variant(dataclasses.replace(ex, prompt=f"{rng.choice(sentences)} {ex.prompt}"),
                       fmt)

    return {"template_swap": dataclasses.replace(OPERATORS["template_swap"], fn=swap),
            "irrelevant_context": dataclasses.replace(OPERATORS["irrelevant_context"],
                                                      fn=context)}


def operators(modality: str, domain: str = "general") -> dict[str, Operator]:
    """The operators that can apply to a `modality` sample, in report order."""
    media = "audio" if modality == "audio" else "image"
    chosen = {n: op for n, op in OPERATORS.items() if op.kind in KINDS.get(modality, ())}
    return {**chosen, **{n: op for n, op in domain_operators(domain, media).items()
                         if n in chosen}}


def variants(example: Example, format_prompt: str = "", seed: int = SEED,
             modality: str = "vision", domain: str = "general"
             ) -> tuple[list[tuple[str, str, Variant]], list[str]]:
    """(operator, kind, variant) for the clean sample and every operator that applies to it, and
    the names of the modality's operators that do not apply (with the reason)."""
    out, skipped = [("clean", "-", Variant(example, format_prompt))], []
    for name, op in operators(modality, domain).items():
        v = apply(op, example, format_prompt, seed)
        if v is None:
            skipped.append(f"{name} ({WHY_NOT.get(name, 'does not apply to this sample')})")
        else:
            out.append((name, KIND_LABELS.get(op.kind, op.kind), v))
    return out, skipped


def canonical(answer: str | None, choices: list[str] | None) -> str | None:
    """An answer as the option it names (letter or text) where it names exactly one."""
    if answer is None or not choices:
        return answer
    hits = [c for i, c in enumerate(choices) if match(answer, chr(65 + i), choices)]
    return hits[0] if len(hits) == 1 else answer


def _same(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return match(a, b) or match(b, a)


def table(cases: list[tuple[str, str, Variant]], texts: list[str], gold: str = ""
          ) -> tuple[list[list[Any]], int]:
    """Table rows for (operator, kind, variant) cases and their completions (clean first), and
    how many flipped the clean answer. `correct` is scored against each variant's own gold
    (remapped by option shuffles, the option text for `mc_to_open`) when a gold is given."""
    answers = [extract_answer(t) for t in texts]
    meant = [canonical(a, v.example.choices) for (_, _, v), a in zip(cases, answers)]
    clean_fmt = cases[0][2].format_prompt
    rows, flips = [], 0
    for (name, kind, v), text, ans, sense in zip(cases, texts, answers, meant):
        flipped = name != "clean" and not _same(sense, meant[0])
        flips += flipped
        correct = ""
        if gold:
            ok = ans is not None and match(ans, v.example.answer, v.example.choices)
            correct = "✓" if ok else "✗"
        shown = v.example.prompt
        if v.format_prompt != clean_fmt:
            shown += f"\n[format instruction: {v.format_prompt}]"
        rows.append([name, kind, shown, ans if ans is not None else "(none)", correct,
                     "⚠ flip" if flipped else "", text[:120]])
    return rows, flips


def answer_one(ctx: DemoContext, variant: Variant, max_new_tokens: int
               ) -> Iterator[tuple[str, int]]:
    """The greedy completion of one variant as it grows: (text so far, tokens), as the `hf`
    rollout engine decodes it for `mmrlvr stress`."""
    return stream_completion(ctx.policy, variant.example, sample=False, temperature=1.0,
                             max_new_tokens=int(max_new_tokens),
                             prompting=ctx.prompting(variant.format_prompt))


def clean_sample(ctx: DemoContext, media: Any, question: str, gold: str, choices: Any
                 ) -> Example:
    """The uploaded image (resized as the model sees it) or clip, and the question, checked."""
    question = check_question(question)
    if isinstance(choices, str):
        choices = check_text(choices, "the option list", MAX_OPTIONS_CHARS)
    options = parse_choices(choices)
    if ctx.modality == "audio":
        from apps.audio_tab import check_audio

        rate, samples = check_audio(media)
        return make_example([(samples, rate)], question, gold, options, audio=True)
    images, _ = prepare_images(ctx.policy, media)
    return make_example(images, question, gold, options)


def run(ctx: DemoContext, media: Any, question: str, gold: str = "", max_new_tokens: int = 64,
        choices: Any = "") -> Iterator[tuple[list[list[Any]], list[Any], str]]:
    """The Robustness handler: yields (table rows so far, images with captions, status) as each
    operator finishes; never raises."""
    modality = ctx.modality if ctx.modality in KINDS else "vision"
    reason = ctx.unavailable(modality, "Robustness")
    if reason:
        yield [], [], reason
        return
    rows: list[list[Any]] = []
    try:
        gold = check_text(gold, "the gold answer", MAX_GOLD_CHARS)
        example = clean_sample(ctx, media, question, gold, choices)
        domain = question_domain(ctx.info, question)
        cases, skipped = variants(example, ctx.format_prompt, modality=modality, domain=domain)
        texts: list[str] = []
        with ctx.lock:
            for k, (name, _, variant) in enumerate(cases):
                running = f"Running **{name}** ({k + 1} of {len(cases)})…"
                yield rows, [], running
                text = ""
                with closing(answer_one(ctx, variant, max_new_tokens)) as stream:
                    for text, n_tokens in stream:   # an update per token: a gone client stops it
                        yield rows, [], f"{running} {n_tokens} tokens"
                texts.append(text)
                rows, _ = table(cases[:k + 1], texts, gold)
        rows, flips = table(cases, texts, gold)
        gallery = [(v.example.images[0], name) for name, kind, v in cases
                   if kind in ("-", "image") and v.example.images]
        n_task = sum(kind == KIND_LABELS["task"] for _, kind, _ in cases)
        status = (f"✓ {len(cases) - 1} operators ran, {flips} flipped the clean answer "
                  f"(clean answer: {rows[0][3]})")
        status += f"; {n_task} task-altering" if n_task else ""
        status += (f". Did not apply to this sample: {'; '.join(skipped)}." if skipped else
                   ". Every operator applied.")
        yield rows, gallery, status
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        message = explain(err)
        if not isinstance(err, UserError):
            warn(message)
        yield rows, [], message


def pick_example(ctx: DemoContext, index: Any) -> list[Any]:
    ex = ctx.info.examples[int(index)]
    stem, listed = split_options(ex.prompt, ex.choices)
    media = ex.audios[0] if ctx.modality == "audio" else ex.images[0]
    return [media, stem.strip(), ex.answer, "\n".join(ex.choices or []) if listed else ""]


def build(ctx: DemoContext) -> None:
    import gradio as gr

    from apps.panels import example_table

    modality = ctx.modality if ctx.modality in KINDS else "vision"
    reason = ctx.unavailable(modality, "Robustness")
    if reason:
        gr.Markdown(f"⚠ {reason}", elem_id="robust-unavailable", elem_classes=["unavailable"])
    by_kind: dict[str, list[str]] = {}
    for name, op in operators(modality).items():
        by_kind.setdefault(KIND_LABELS.get(op.kind, op.kind), []).append(name)
    listing = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in by_kind.items())
    gr.Markdown(f"One sample through the stress operators of `mmrlvr stress` for a {modality} "
                f"model ({listing}). Option operators and `mc_to_open` need listed options and "
                "a gold answer. Greedy answers; a flip is an answer that differs from the clean "
                "one.", elem_classes=["note"])
    ready = reason is None
    media_label, types = (("clip", ["audio"]) if modality == "audio" else ("image", ["image"]))
    with gr.Row(equal_height=False):
        with gr.Column(scale=4, min_width=320):
            media = gr.File(label=media_label, file_types=types, elem_id="robust-file",
                            height=110, interactive=ready)
            question = gr.Textbox(label="question (Enter runs)", lines=1, max_lines=4,
                                  elem_id="robust-question", interactive=ready,
                                  max_length=MAX_QUESTION_CHARS)
            with gr.Row():
                gold = gr.Textbox(label="gold answer (needed with options)",
                                  elem_id="robust-gold", interactive=ready,
                                  max_length=MAX_GOLD_CHARS)
                options = gr.Textbox(label="options (one per line)", lines=1, max_lines=6,
                                     elem_id="robust-options", interactive=ready,
                                     max_length=MAX_OPTIONS_CHARS)
            with gr.Accordion("generation settings", open=False):
                max_new = gr.Slider(8, 1024, value=64, step=8, label="max new tokens")
        with gr.Column(scale=5, min_width=320):
            submit = gr.Button("Run every operator", variant="primary", interactive=ready,
                               elem_id="robust-submit")
            status = gr.Markdown(elem_id="robust-status", elem_classes=["status"])
            examples = example_table(ctx, modality, ready, per_page=4, elem="robust")
    result = gr.Dataframe(headers=TABLE_HEADERS, label="answers", interactive=False, wrap=True,
                          max_height=2000, elem_id="robust-table", elem_classes=["plain-table"],
                          column_widths=["12%", "8%", "28%", "11%", "7%", "7%", "27%"])
    gallery = gr.Gallery(label="what the model saw", columns=7, height=180, object_fit="contain",
                         visible=modality != "audio")

    def on_run(media, question, gold, options, max_new):
        yield from run(ctx, media, question, gold, max_new, options)

    inputs = [media, question, gold, options, max_new]
    submit.click(on_run, inputs, [result, gallery, status], api_name="robustness",
                 show_progress="hidden")
    question.submit(on_run, inputs, [result, gallery, status], api_name="robustness_enter",
                    show_progress="hidden")
    if examples is not None:
        examples.click(lambda i: pick_example(ctx, i), examples, [media, question, gold, options],
                       api_name="robustness_example", show_progress="hidden")
