"""The answer of one model as a person reads it: final answer, verdict, reasoning, raw text.

Vision QA and Audio QA show one panel per model (the trained one and, with `--compare`, the
base one side by side). `panel_values` turns a completion (growing while it streams) into the
panel's four values; `ask_models` streams both models' answers to one example in turn.
`example_table` lists the run's examples in a tab, one click away from its inputs.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.common import DemoContext
from apps.generate import split_completion, stream_completion
from apps.verdicts import verdict
from mmrlvr.data import Example

_TAG = re.compile(r"<[^>]+>")
NO_GOLD = "Type a gold answer (or click an example) to see the verdict."


@dataclass
class Panel:
    """The components of one model's panel (gradio objects)."""

    answer: Any
    verdict: Any
    reasoning: Any
    raw: Any

    def outputs(self) -> list[Any]:
        return [self.answer, self.verdict, self.reasoning, self.raw]


def short(path: str) -> str:
    """A model dir as its last two path parts (`run/final`); the header names it in full."""
    return "/".join(Path(path).parts[-2:]) if path else "—"


def build_panel(prefix: str, title: str, path: str = "") -> Panel:
    """A column's worth of components: `#{prefix}-answer`, `-verdict`, `-reasoning`, `-raw`.
    The title names `path` when given (the base side's; the trained side's changes with the
    checkpoint dropdown, whose status names it)."""
    import gradio as gr

    named = f" · `{short(path)}`" if path else ""
    gr.Markdown(f"#### {title}{named}", elem_classes=["panel-title"])
    answer = gr.Markdown(elem_id=f"{prefix}-answer", elem_classes=["final-answer"],
                         value="*final answer*")
    verdict_md = gr.Markdown(elem_id=f"{prefix}-verdict")
    reasoning = gr.Textbox(label="reasoning", lines=3, max_lines=8, elem_id=f"{prefix}-reasoning",
                           interactive=False)
    with gr.Accordion("raw completion", open=False):
        raw = gr.Textbox(show_label=False, lines=3, max_lines=12, elem_id=f"{prefix}-raw",
                         interactive=False, buttons=["copy"])
    return Panel(answer, verdict_md, reasoning, raw)


def build_panels(prefix: str, ctx: DemoContext) -> tuple[Panel, Panel]:
    """The trained model's panel beside the base model's (hidden when the demo has no base)."""
    import gradio as gr

    with gr.Row(equal_height=False):
        with gr.Column(min_width=200):
            trained = build_panel(prefix, "trained model")
        with gr.Column(min_width=200, visible=ctx.base is not None):
            base = build_panel(f"{prefix}-base", "base model", ctx.base_path)
    return trained, base


def panel_values(text: str, example: Example | None, done: bool) -> list[str]:
    """(answer markdown, verdict markdown, reasoning, raw) for a completion so far.

    `example` carries the gold (None: no gold given); the verdict is given once `done`.
    """
    reasoning, final = split_completion(text)
    if final:
        answer = f"**Answer: {final}**"
    elif done:
        answer = "**No final answer** in the completion" if text else "**Empty completion**"
    else:
        answer = "*writing…*"
    if not done:
        judged = ""
    elif example is None:
        judged = NO_GOLD
    else:
        judged = verdict(example, text)
    return [answer, judged, reasoning, text]


def empty_panel(note: str = "") -> list[str]:
    return [note, "", "", ""]


def ask_models(ctx: DemoContext, example: Example, *, compare: bool, sample: bool,
               temperature: float, max_new_tokens: int, format_prompt: str
               ) -> Iterator[tuple[int, str, int, bool]]:
    """Stream the trained model's answer, then the base model's (when `compare` and one is
    loaded): yields (model index 0/1, text so far, tokens, done) under the model lock."""
    policies = [ctx.policy] + ([ctx.base] if compare and ctx.base is not None else [])
    with ctx.lock:
        for k, policy in enumerate(policies):
            stream = stream_completion(policy, example, sample=sample, temperature=temperature,
                                       max_new_tokens=max_new_tokens,
                                       prompting=ctx.prompting(format_prompt))
            text, n_tokens = "", 0
            with closing(stream):       # a closed page stops generation before the lock is freed
                for text, n_tokens in stream:
                    yield k, text, n_tokens, False
            yield k, text, n_tokens, True


def example_table(ctx: DemoContext, modality: str, ready: bool, per_page: int = 6,
                  elem: str = "") -> Any:
    """The run's examples as a clickable table, `#{elem or modality}-examples` (None when there
    are none for `modality`; a note says how to get some)."""
    import gradio as gr

    found = ctx.info.examples if ready and ctx.info.examples_for == modality else []
    if not found:
        if ready and ctx.info.run_dir is not None and ctx.info.examples_for == modality:
            gr.Markdown(f"No examples here: {ctx.info.examples_note or 'none were found'}.",
                        elem_classes=["note"])
        elif ready:
            gr.Markdown("No examples here: start the demo with `--run RUN_DIR`; the run's eval "
                        "data gives them.", elem_classes=["note"])
        return None
    source = ctx.info.data_file.name if ctx.info.data_file else "the run's data"
    if modality == "audio":
        kinds, headers = ["textbox"] * 3, ["clip", "question", "gold"]
        samples = [[ex.id, ex.prompt.replace("\n", " · "), ex.answer] for ex in found]
    elif modality == "image_translation":
        from modalities.image_translation import language_name

        kinds, headers = ["image", "textbox", "textbox"], ["image", "into", "reference text"]
        samples = [[ex.images[0], language_name(str(ex.meta.get("target_lang", "?"))),
                    _TAG.sub(" ", ex.answer).strip()] for ex in found]
    else:
        kinds, headers = ["image", "textbox", "textbox"], ["image", "question", "gold"]
        samples = [[ex.images[0], ex.prompt, ex.answer] for ex in found]
    return gr.Dataset(label=f"examples from {source} (click one)", components=kinds,
                      samples=samples, headers=headers, type="index", samples_per_page=per_page,
                      elem_id=f"{elem or modality}-examples", layout="table",
                      elem_classes=["examples"])
