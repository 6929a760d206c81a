"""Audio QA: upload or microphone → streamed answer, acoustic evidence and rubric scores.

The tab checks its input, then says why it cannot answer: no model loaded, a model of another
modality, or (for now) that the tab is not yet wired to the audio adapter's streaming path.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from apps.common import DemoContext, UserError, check_question, explain

MAX_SECONDS = 30.0
"""Longest clip: the window Qwen2-Audio's feature extractor reads."""
SILENCE_PEAK = 1e-3
"""A clip whose loudest sample is below this (full scale 1.0) counts as silent."""
RUBRIC_HEADERS = ["rubric", "score"]


def check_audio(audio: Any) -> tuple[int, np.ndarray]:
    """Gradio's (sample_rate, samples) as float mono in [-1, 1], or a UserError saying why not."""
    if audio is None:
        raise UserError("Upload or record a clip first.")
    rate, samples = audio
    samples = np.asarray(samples)
    if np.issubdtype(samples.dtype, np.integer):
        samples = samples.astype(np.float32) / np.iinfo(samples.dtype).max
    samples = samples.astype(np.float32)
    if samples.ndim == 2:
        samples = samples.mean(axis=1)
    if samples.size == 0 or not rate:
        raise UserError("The clip is empty.")
    seconds = samples.size / rate
    if seconds > MAX_SECONDS:
        raise UserError(f"The clip is {seconds:.0f} s long; the model reads at most "
                        f"{MAX_SECONDS:.0f} s — trim it.")
    if float(np.abs(samples).max()) < SILENCE_PEAK:
        raise UserError("The clip is silent (no sample above -60 dBFS); check the microphone.")
    return int(rate), samples


def answer(ctx: DemoContext, audio: Any, question: str) -> tuple[str, str, list[list[Any]], str]:
    """The Audio QA handler: (answer, acoustic evidence, rubric rows, status); never raises."""
    try:
        check_audio(audio)
        check_question(question)
        reason = ctx.unavailable("audio", "Audio QA")
        if reason:
            return "", "", [], reason
        raise UserError("Audio QA is not wired to the audio adapter yet.")
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        return "", "", [], explain(err)


def build(ctx: DemoContext) -> None:
    import gradio as gr

    reason = ctx.unavailable("audio", "Audio QA")
    if reason:
        gr.Markdown(f"**{reason}**", elem_id="audio-unavailable")
    with gr.Row():
        with gr.Column():
            audio = gr.Audio(sources=["upload", "microphone"], type="numpy", label="audio")
            question = gr.Textbox(label="question", lines=2)
            submit = gr.Button("Ask", variant="primary")
        with gr.Column():
            status = gr.Markdown()
            answer_box = gr.Textbox(label="answer")
            evidence = gr.Markdown()
            rubric = gr.Dataframe(headers=RUBRIC_HEADERS, label="rubric scores",
                                  interactive=False)

    def on_ask(audio, question):
        return answer(ctx, audio, question)

    submit.click(on_ask, [audio, question], [answer_box, evidence, rubric, status],
                 api_name="audio_answer")
