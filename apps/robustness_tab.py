"""Robustness: one sample through every stress operator; answers in a table, flips marked.

The operators are the library's (`mmrlvr.stress.ops.OPERATORS`, the ones `mmrlvr stress` uses),
applied with `stress_ops.apply(op, example, format_prompt, seed)`: every operator that applies to
the sample runs, the rest (a `None` variant) are skipped — image operators need an image, the
option operators and the task-altering `mc_to_open` need listed options with a gold answer, audio
operators need audio. Image operators act on the image the model sees (after resizing to the
adapter's min/max pixels). Every variant is answered greedily by the `hf` rollout engine, one
batch per format instruction. A *flip* is a variant whose extracted answer differs from the clean
one's (compared by `rewards.verify.match`; with options, a letter counts as its option's text,
so a shuffle that moves the chosen option is no flip). Task-altering rows are marked as such.
"""
from __future__ import annotations

import re
from typing import Any

from PIL import Image

from apps.common import DemoContext, UserError, check_question, explain, prepare_images, warn
from mmrlvr.data import Example
from mmrlvr.stress import OPERATORS, Variant, apply, gold_index
from mmrlvr.core.templates import with_options
from rewards.verify import extract_answer, match

TABLE_HEADERS = ["operator", "kind", "question", "answer", "correct", "flip", "completion"]
KIND_LABELS = {"text": "text", "image": "image", "audio": "audio", "task": "task-altering"}
SEED = 0
MAX_CHOICES = 26
_LABEL = re.compile(r"^\(?([A-Za-z])[.)]\s+")


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


def make_example(images: list[Image.Image], question: str, gold: str = "",
                 choices: list[str] | None = None) -> Example:
    """The clean sample: options listed under the question as training and `mmrlvr stress` do."""
    ex = Example(id="demo", prompt=with_options(question, choices), answer=gold or "-",
                 images=list(images), choices=choices)
    if choices and gold_index(ex) is None:
        raise UserError("With options, give the gold answer as an option's letter or its text "
                        f"(got {gold!r}).")
    return ex


def variants(example: Example, format_prompt: str = "", seed: int = SEED
             ) -> list[tuple[str, str, Variant]]:
    """(operator, kind, variant) for the clean sample and every operator that applies to it."""
    out = [("clean", "-", Variant(example, format_prompt))]
    for name, op in OPERATORS.items():
        v = apply(op, example, format_prompt, seed)
        if v is not None:
            out.append((name, KIND_LABELS.get(op.kind, op.kind), v))
    return out


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


def answer_all(ctx: DemoContext, cases: list[tuple[str, str, Variant]], max_new_tokens: int
               ) -> list[str]:
    """Greedy completions for every case, in order; one batch per format instruction."""
    from mmrlvr.rollout import SamplingParams, make_engine

    policy = ctx.policy
    engine = make_engine("hf", policy)
    groups: dict[str, list[int]] = {}
    for i, (_, _, v) in enumerate(cases):
        groups.setdefault(v.format_prompt, []).append(i)
    texts = [""] * len(cases)
    for fmt, idx in groups.items():
        batch = policy.adapter.encode([cases[i][2].example for i in idx], policy.processor,
                                      system_prompt=ctx.system_prompt, format_prompt=fmt)
        out = engine.generate(batch, SamplingParams(max_new_tokens=int(max_new_tokens),
                                                    greedy=True))
        for i, text in zip(idx, out.texts):
            texts[i] = text
    return texts


def run(ctx: DemoContext, files: Any, question: str, gold: str = "",
        max_new_tokens: int = 64, choices: Any = ""
        ) -> tuple[list[list[Any]], list[tuple[Image.Image, str]], str]:
    """The Robustness handler: (table rows, images with captions, status); never raises."""
    reason = ctx.unavailable("vision", "Robustness")
    if reason:
        return [], [], reason
    try:
        question = check_question(question)
        options = parse_choices(choices)
        images, _ = prepare_images(ctx.policy, files)
        gold = (gold or "").strip()
        cases = variants(make_example(images, question, gold, options), ctx.format_prompt)
        with ctx.lock:
            texts = answer_all(ctx, cases, max_new_tokens)
        rows, flips = table(cases, texts, gold)
        gallery = [(v.example.images[0], name) for name, kind, v in cases
                   if kind in ("-", "image") and v.example.images]
        skipped = len(OPERATORS) - (len(cases) - 1)
        n_task = sum(kind == KIND_LABELS["task"] for _, kind, _ in cases)
        status = (f"✓ {len(cases) - 1} operators, {flips} flipped the clean answer "
                  f"(clean answer: {rows[0][3]}); {skipped} did not apply to this sample")
        status += f"; {n_task} task-altering." if n_task else "."
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
    by_kind: dict[str, list[str]] = {}
    for name, op in OPERATORS.items():
        by_kind.setdefault(KIND_LABELS.get(op.kind, op.kind), []).append(name)
    listing = "; ".join(f"{kind} — {', '.join(names)}" for kind, names in by_kind.items())
    gr.Markdown("One sample through every stress operator of `mmrlvr stress` that applies to it "
                f"({listing}). Option operators need options and a gold answer. Greedy answers; "
                "a flip is an answer that differs from the clean one.")
    with gr.Row():
        with gr.Column(scale=1):
            image = gr.File(label="image", file_types=["image"], elem_id="robust-file")
            question = gr.Textbox(label="question", lines=2)
            gold = gr.Textbox(label="gold answer (optional; needed with options)")
            options = gr.Textbox(label="options (optional, one per line)", lines=3)
            max_new = gr.Slider(8, 1024, value=64, step=8, label="max new tokens")
            submit = gr.Button("Run every operator", variant="primary",
                               interactive=reason is None)
        with gr.Column(scale=2):
            status = gr.Markdown()
            table = gr.Dataframe(headers=TABLE_HEADERS, label="answers", interactive=False,
                                 wrap=True, max_height=600,
                                 column_widths=["13%", "9%", "25%", "13%", "7%", "7%", "26%"])
            gallery = gr.Gallery(label="what the model saw", columns=7, height=200,
                                 object_fit="contain")

    def on_run(image, question, gold, options, max_new):
        return run(ctx, image, question, gold, max_new, options)

    submit.click(on_run, [image, question, gold, options, max_new], [table, gallery, status],
                 api_name="robustness")
