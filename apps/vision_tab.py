"""Vision QA: image(s) and/or video(s) + question → the trained model's answer beside the base model's, verdicts.

Each answer streams token by token (`apps.generate.stream_completion`, the `hf` rollout engine's
prompt and suppression) into a panel that keeps the reasoning and the final answer apart, the raw
completion one click away (`apps.panels`). With a gold answer (typed, or from a clicked example),
each completion gets the verifier's verdict and the training rewards, one explained row each
(`apps.verdicts`). Enter in the question box asks.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from apps.common import (MAX_FORMAT_CHARS, MAX_GOLD_CHARS, MAX_QUESTION_CHARS, VIDEO_TYPES,
                         DemoContext, UserError, check_format, check_question, check_text,
                         explain, prepare_media, warn)
from apps.panels import (NO_GOLD, ask_models, build_panels, empty_panel, example_table,
                         panel_values)
from apps.verdicts import listed_choices, reward_rows, reward_specs
from mmrlvr.data import Example

IMAGE_TYPES = {"png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff"}
WIDTHS = {4: ["26%", "12%", "12%", "50%"], 5: ["24%", "12%", "12%", "12%", "40%"]}
"""Reward table columns by count (with and without the base model): the explanation wraps."""
Update = list[Any]
"""trained panel (answer, verdict, reasoning, raw), base panel (the same), reward rows, status."""


def reward_headers(ctx: DemoContext) -> list[str]:
    scores = ["trained", "base"] if ctx.base is not None else ["score"]
    return ["reward", "weight", *scores, "what it counts"]


def answer(ctx: DemoContext, files: Any, question: str, gold: str = "", sample: bool = False,
           temperature: float = 1.0, max_new_tokens: int = 128,
           format_prompt: str | None = None, compare: bool = True) -> Iterator[Update]:
    """The Vision QA handler: yields updates while the answers stream; never raises."""
    reason = ctx.unavailable("vision", "Vision QA")
    if reason:
        yield [*empty_panel(), *empty_panel(), [], reason]
        return
    panels = [empty_panel(), empty_panel()]
    try:
        question = check_question(question)
        gold = check_text(gold, "the gold answer", MAX_GOLD_CHARS)
        fmt = check_format(ctx, format_prompt)
        images, clips, notes = prepare_media(ctx.policy, files)
        example = Example(id="demo", prompt=question, answer=gold or "-", images=images,
                          videos=clips, choices=listed_choices(question))
        judged = example if gold else None
        sizes = "; ".join(notes)
        compare = bool(compare) and ctx.base is not None
        names = ["trained model", "base model"]
        texts: list[str | None] = [None, None]
        counts = [0, 0]
        panels[1] = empty_panel("*waiting for the trained model…*" if compare else "")
        yield [*panels[0], *panels[1], [], f"Generating with the trained model… ({sizes})"]
        for k, text, n_tokens, done in ask_models(
                ctx, example, compare=compare, sample=bool(sample),
                temperature=float(temperature), max_new_tokens=int(max_new_tokens),
                format_prompt=fmt):
            panels[k] = panel_values(text, judged, done)
            counts[k] = n_tokens
            if done:
                texts[k] = text
            status = (f"Generating with the {names[k]}… {n_tokens} tokens" if not done else
                      f"Generating with the {names[1]}…" if k == 0 and compare else "Scoring…")
            yield [*panels[0], *panels[1], [], status]
        rows = reward_rows(example, texts[:2 if ctx.base is not None else 1],
                           reward_specs(ctx.info.config)) if gold else []
        how = "sampled" if sample else "greedy"
        made = f"trained {counts[0]} tokens" + (f", base {counts[1]}" if compare else "")
        status = f"✓ done: {made}, {how} ({sizes})"
        if not texts[0]:
            status += " — the trained model ended at once and produced no text"
        if not gold:
            status += ". " + NO_GOLD
        yield [*panels[0], *panels[1], rows, status]
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        message = explain(err)
        if not isinstance(err, UserError):
            warn(message)
        yield [*panels[0], *panels[1], [], message]


def preview(files: Any) -> list[Any]:
    """Uploaded files for the gallery (images and videos; other files are dropped here)."""
    if not files:
        return []
    files = [files] if isinstance(files, str) else files
    return [f for f in files if str(f).lower().rsplit(".", 1)[-1] in IMAGE_TYPES | VIDEO_TYPES]


def pick_example(ctx: DemoContext, index: Any) -> list[Any]:
    """A clicked example: (files, question, gold), then cleared panels, rows and status."""
    ex = ctx.info.examples[int(index)]
    note = f"Example `{ex.id}` loaded: press **Ask** (or Enter in the question)."
    return [[*ex.images, *(v for v in ex.videos if isinstance(v, str))], ex.prompt, ex.answer,
            *empty_panel(), *empty_panel(), [], note]


def build(ctx: DemoContext) -> None:
    import gradio as gr

    reason = ctx.unavailable("vision", "Vision QA")
    ready = reason is None
    if reason:
        gr.Markdown(f"⚠ {reason}", elem_id="vision-unavailable", elem_classes=["unavailable"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=360):
            with gr.Row(equal_height=True):
                files = gr.File(label="image(s) or video(s)", file_count="multiple",
                                file_types=["image", "video"],
                                elem_id="vision-files", height=130, interactive=ready)
                gallery = gr.Gallery(label="what you uploaded", show_label=False, height=130,
                                     columns=3, interactive=False, object_fit="contain",
                                     allow_preview=False, fit_columns=False)
            question = gr.Textbox(label="question (Enter asks)", lines=1, max_lines=4,
                                  elem_id="vision-question", interactive=ready,
                                  max_length=MAX_QUESTION_CHARS,
                                  placeholder="How many shapes are in the image?")
            gold = gr.Textbox(label="gold answer (optional: gives the verdict and rewards)",
                              elem_id="vision-gold", interactive=ready,
                              max_length=MAX_GOLD_CHARS)
            with gr.Row():
                submit = gr.Button("Ask", variant="primary", elem_id="vision-submit",
                                   interactive=ready, scale=2)
                compare = gr.Checkbox(label="compare with the base model", value=True,
                                      visible=ctx.base is not None and ready, scale=1,
                                      elem_id="vision-compare")
            status = gr.Markdown(elem_id="vision-status", elem_classes=["status"])
            with gr.Accordion("generation settings", open=False):
                with gr.Row():
                    sample = gr.Checkbox(label="sample (otherwise greedy)", value=False,
                                         elem_id="vision-sample")
                    temperature = gr.Slider(0.1, 2.0, value=1.0, step=0.1, label="temperature")
                    max_new = gr.Slider(8, 2048, value=128, step=8, label="max new tokens",
                                        elem_id="vision-max-new")
                fmt = gr.Textbox(label="format prompt appended to the question",
                                 value=ctx.format_prompt, lines=2, elem_id="vision-format",
                                 max_length=max(MAX_FORMAT_CHARS, len(ctx.format_prompt)))
            examples = example_table(ctx, "vision", ready)
        with gr.Column(scale=7, min_width=420, visible=ready):
            trained, base = build_panels("vision", ctx)
            rewards = gr.Dataframe(headers=reward_headers(ctx), label="rewards (as in training)",
                                   interactive=False, wrap=True, max_height=400,
                                   elem_id="vision-rewards", elem_classes=["plain-table"],
                                   column_widths=WIDTHS[len(reward_headers(ctx))])

    def on_ask(files, question, gold, sample, temperature, max_new, fmt, compare):
        yield from answer(ctx, files, question, gold, sample, temperature, max_new, fmt, compare)

    outputs = [*trained.outputs(), *base.outputs(), rewards, status]
    files.change(preview, files, gallery, api_name="vision_preview", show_progress="hidden")
    ask_inputs = [files, question, gold, sample, temperature, max_new, fmt, compare]
    submit.click(on_ask, ask_inputs, outputs, api_name="vision_answer",
                 show_progress="hidden")
    question.submit(on_ask, ask_inputs, outputs, api_name="vision_answer_enter",
                    show_progress="hidden")
    if examples is not None:
        examples.click(lambda i: pick_example(ctx, i), examples,
                       [files, question, gold, *outputs], api_name="vision_example",
                       show_progress="hidden")

