"""Vision QA: image(s) + question → streamed reasoning and answer, verdict and reward breakdown.

Generation is transformers `generate` in a thread feeding a `TextIteratorStreamer`, with the
media placeholder tokens suppressed exactly as the `hf` rollout engine does. With a gold answer,
the final text is scored by the training rewards (accuracy 0.9 + format 0.1) and
`rewards.verify.extract_answer`/`match` give the verdict.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import torch

from apps.common import DemoContext, UserError, check_question, explain, prepare_images, warn
from mmrlvr.data import Example
from mmrlvr.core.types import to_device
from rewards.base import build_combined
from rewards.verify import extract_answer, match

REWARDS = [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1}]
BREAKDOWN_HEADERS = ["component", "weight", "score"]
STREAM_TIMEOUT_S = 600.0
"""Longest wait for the next token before the stream gives up (a hung generate thread)."""

Update = tuple[str, str, str, list[list[Any]], str]
"""(completion so far, extracted answer, verdict markdown, breakdown rows, status markdown)."""


class _Stop:
    """Stopping criterion that ends generation when the reader goes away (tab closed, new ask)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.steps = 0
        """Tokens generated so far (the criterion runs once per new token)."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        self.steps += 1
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool,
                          device=input_ids.device)


def stream_completion(policy: Any, example: Example, *, sample: bool, temperature: float,
                      max_new_tokens: int, system_prompt: str = "",
                      format_prompt: str = "") -> Iterator[tuple[str, int]]:
    """Yield (completion text so far, tokens generated) as it grows (one prompt, any adapter).

    The prompt goes through the adapter's `encode` and `generation_inputs` as in the `hf` rollout
    engine (the audio adapter encodes the clip once and hands `generate` its `inputs_embeds`).
    """
    from transformers import StoppingCriteriaList, TextIteratorStreamer

    batch = policy.adapter.encode([example], policy.processor, system_prompt=system_prompt,
                                  format_prompt=format_prompt)
    inputs = to_device(batch.inputs, policy.device, policy.dtype)
    streamer = TextIteratorStreamer(policy.tokenizer, skip_prompt=True, skip_special_tokens=True,
                                    timeout=STREAM_TIMEOUT_S)
    stop = _Stop()
    kwargs = {"max_new_tokens": int(max_new_tokens), "eos_token_id": policy.eos_ids,
              "pad_token_id": policy.pad_id, "suppress_tokens": policy.placeholder_ids,
              "streamer": streamer, "stopping_criteria": StoppingCriteriaList([stop])}
    if sample:
        kwargs.update(do_sample=True, temperature=float(temperature), top_p=1.0, top_k=None)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            with torch.no_grad():
                policy.model.generate(**inputs, **kwargs)
        except BaseException as err:  # noqa: BLE001 — re-raised in the reader below
            failure.append(err)
            streamer.end()

    was_training = policy.model.training
    policy.model.eval()
    try:
        with torch.no_grad():
            inputs = policy.adapter.generation_inputs(policy.base_model(), batch, inputs)
    except BaseException:
        policy.model.train(was_training)
        raise
    thread = threading.Thread(target=run, name="demo-generate", daemon=True)
    thread.start()
    text = ""
    try:
        for piece in streamer:
            text += piece
            yield text, stop.steps
    finally:
        stop.event.set()
        thread.join()
        policy.model.train(was_training)
    if failure:
        raise failure[0]


def verdict(example: Example, text: str) -> tuple[str, list[list[Any]]]:
    """The verifier's verdict (markdown) and the reward breakdown rows for a final completion."""
    answer = extract_answer(text)
    combined = build_combined(REWARDS)
    scores = combined.score(example, [text])[0]
    rows = [["overall (weighted sum)", "", round(scores["overall"], 4)]]
    for name, weight, _ in combined.parts:
        rows.append([name, weight, round(scores[name], 4)])
        rows += [[key, "", round(value, 4)] for key, value in scores.items()
                 if key.startswith(f"{name}/")]
    gold = f"`{example.answer}`"
    if answer is None:
        md = (f"**No answer found** (scores 0): no `<answer>…</answer>`, `\\boxed{{}}` or "
              f"\"the answer is …\" in the completion. Gold: {gold}.")
    elif match(answer, example.answer, example.choices):
        md = f"✓ **Correct**: the extracted answer `{answer}` matches the gold {gold}."
    else:
        md = f"✗ **Wrong**: the extracted answer `{answer}` does not match the gold {gold}."
    return md, rows


def answer(ctx: DemoContext, files: Any, question: str, gold: str = "", sample: bool = False,
           temperature: float = 1.0, max_new_tokens: int = 128,
           format_prompt: str | None = None) -> Iterator[Update]:
    """The Vision QA handler: yields updates while the answer streams; never raises."""
    reason = ctx.unavailable("vision", "Vision QA")
    if reason:
        yield "", "", "", [], reason
        return
    policy, text, n_tokens = ctx.policy, "", 0
    try:
        question = check_question(question)
        images, notes = prepare_images(policy, files)
        gold = (gold or "").strip()
        example = Example(id="demo", prompt=question, answer=gold or "-", images=images)
        fmt = ctx.format_prompt if format_prompt is None else format_prompt
        sizes = "; ".join(notes)
        pending = "" if gold else "Type a gold answer to see the verifier's verdict and rewards."
        with ctx.lock:
            yield "", "", pending, [], f"Generating… ({sizes})"
            stream = stream_completion(policy, example, sample=bool(sample),
                                       temperature=float(temperature),
                                       max_new_tokens=int(max_new_tokens),
                                       system_prompt=ctx.system_prompt, format_prompt=fmt)
            with closing(stream):  # a closed page stops generation before the lock is freed
                for text, n_tokens in stream:
                    yield text, extract_answer(text) or "", pending, [], "Generating…"
        extracted = extract_answer(text)
        md, rows = verdict(example, text) if gold else (pending, [])
        status = f"✓ done: {n_tokens} tokens, {'sampled' if sample else 'greedy'} ({sizes})"
        if not text:
            status += " — the model ended at once and produced no text"
        yield text, extracted or "(no answer extracted)", md, rows, status
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        message = explain(err)
        if not isinstance(err, UserError):
            warn(message)
        yield text, "", "", [], message


def preview(files: Any) -> list[Any]:
    """Uploaded files for the gallery (the ones that are not images are dropped here)."""
    if not files:
        return []
    files = [files] if isinstance(files, str) else files
    return [f for f in files if str(f).lower().rsplit(".", 1)[-1] in
            {"png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff"}]


def build(ctx: DemoContext) -> None:
    import gradio as gr

    reason = ctx.unavailable("vision", "Vision QA")
    if reason:
        gr.Markdown(f"**{reason}**", elem_id="vision-unavailable")
    with gr.Row():
        with gr.Column():
            files = gr.File(label="image(s)", file_count="multiple", file_types=["image"],
                            elem_id="vision-files")
            gallery = gr.Gallery(label="uploaded", show_label=False, height=160, columns=4,
                                 interactive=False, object_fit="contain", fit_columns=False)
            question = gr.Textbox(label="question", lines=2, elem_id="vision-question",
                                  placeholder="How many shapes are in the image?")
            gold = gr.Textbox(label="gold answer (optional: shows the verdict and rewards)",
                              elem_id="vision-gold")
            with gr.Row():
                sample = gr.Checkbox(label="sample (otherwise greedy)", value=False)
                temperature = gr.Slider(0.1, 2.0, value=1.0, step=0.1, label="temperature")
                max_new = gr.Slider(8, 2048, value=128, step=8, label="max new tokens")
            with gr.Accordion("prompt", open=False):
                fmt = gr.Textbox(label="format prompt appended to the question",
                                 value=ctx.format_prompt, lines=2)
            submit = gr.Button("Ask", variant="primary", elem_id="vision-submit",
                               interactive=reason is None)
        with gr.Column():
            status = gr.Markdown(elem_id="vision-status")
            completion = gr.Textbox(label="reasoning and answer (streamed)", lines=8,
                                    elem_id="vision-completion")
            extracted = gr.Textbox(label="extracted answer", elem_id="vision-answer")
            verdict_md = gr.Markdown(elem_id="vision-verdict")
            breakdown = gr.Dataframe(headers=BREAKDOWN_HEADERS, label="reward breakdown",
                                     interactive=False)

    def on_ask(files, question, gold, sample, temperature, max_new, fmt):
        yield from answer(ctx, files, question, gold, sample, temperature, max_new, fmt)

    files.change(preview, files, gallery, api_name="vision_preview", show_progress="hidden")
    ask_inputs = [files, question, gold, sample, temperature, max_new, fmt]
    ask_outputs = [completion, extracted, verdict_md, breakdown, status]
    submit.click(on_ask, ask_inputs, ask_outputs, api_name="vision_answer")
    question.submit(on_ask, ask_inputs, ask_outputs, api_name="vision_answer_enter")
