"""Audio QA: upload or microphone → streamed answer, acoustic evidence and rubric scores.

The clip (a file Gradio saved, or a `(sample_rate, samples)` pair) is checked (empty, silent,
over-long, undecodable → a message), resampled to the feature extractor's rate and cut to the
model's window, then asked through the audio adapter with the Vision QA tab's streaming
(`vision_tab.stream_completion`: `encode` + `generation_inputs`, so the clip is encoded once).
Before the answer streams, the tab shows the clip's acoustic evidence
(`rewards.audio_evidence.extract_evidence`); when it ends, the static rubrics written from that
evidence (`static_rubrics`) are checked against the answer's reasoning by the rule-based judge
(`rewards.rubric_judges.check_satisfied`), the static fallback of the AudioRubrics reward.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np

from apps.common import DemoContext, UserError, check_question, explain, warn
from mmrlvr.data import DataError, Example

MAX_SECONDS = 30.0
"""Longest clip: the window Qwen2-Audio's feature extractor reads."""
SILENCE_PEAK = 1e-3
"""A clip whose loudest sample is below this (full scale 1.0) counts as silent."""
READ_RATE = 16000
"""Rate an uploaded file is decoded at (Qwen2-Audio's; the evidence is computed at it too)."""
RUBRIC_HEADERS = ["rubric", "category", "weight", "satisfied"]

Update = tuple[str, str, list[list[Any]], str]
"""(completion so far, evidence markdown, rubric rows, status markdown)."""


def check_audio(audio: Any) -> tuple[int, np.ndarray]:
    """An upload (file path) or Gradio's (sample_rate, samples) as float mono in [-1, 1], or a
    UserError saying why not."""
    if audio is None or (isinstance(audio, str) and not audio.strip()):
        raise UserError("Upload or record a clip first.")
    if isinstance(audio, dict):          # gradio FileData as a dict (API callers)
        audio = audio.get("path")
    if isinstance(audio, (str, Path)):
        from mmrlvr.data import read_audio

        name = Path(str(audio)).name
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")      # silence and upsampling are checked below
                samples = read_audio(audio, READ_RATE, sample="upload")
        except DataError as err:
            raise UserError(f"{name} cannot be used as audio: {str(err).split(': ', 2)[-1]}. "
                            "Upload a WAV, FLAC, MP3 or OGG clip.") from None
        rate = READ_RATE
    else:
        try:
            rate, samples = audio
        except (TypeError, ValueError):
            raise UserError("The audio input is not a clip; upload a WAV, FLAC, MP3 or OGG file."
                            ) from None
        samples = np.asarray(samples)
        if np.issubdtype(samples.dtype, np.integer):
            samples = samples.astype(np.float32) / np.iinfo(samples.dtype).max
        samples = samples.astype(np.float32)
        if samples.ndim == 2:
            samples = samples.mean(axis=1)
    if samples.size == 0 or not rate:
        raise UserError("The clip is empty.")
    if not np.isfinite(samples).all():
        raise UserError("The clip holds NaN or infinite samples (a corrupt file?).")
    seconds = samples.size / rate
    if seconds > MAX_SECONDS:
        raise UserError(f"The clip is {seconds:.0f} s long; the model reads at most "
                        f"{MAX_SECONDS:.0f} s — trim it.")
    if float(np.abs(samples).max()) < SILENCE_PEAK:
        raise UserError("The clip is silent (no sample above -60 dBFS); check the microphone.")
    return int(rate), samples


def model_clip(policy: Any, rate: int, samples: np.ndarray) -> tuple[np.ndarray, int, str]:
    """The clip at the feature extractor's rate, cut to its window: (clip, rate, size note)."""
    from mmrlvr.data import read_audio

    fe = policy.processor.feature_extractor
    sr, window = int(fe.sampling_rate), int(fe.n_samples)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clip = read_audio((samples, rate), sr, sample="demo")
    note = f"clip: {samples.size / rate:.2f} s at {rate} Hz"
    if clip.size > window:
        clip = clip[:window]
        note += f", cut to the model's {window / sr:g} s window"
    return clip, sr, note


def evidence_markdown(ev: dict[str, Any]) -> str:
    """The acoustic evidence as a short markdown summary (and the raw values, folded)."""
    import json

    loud, pitch, tempo = ev["loudness"], ev["pitch"], ev["tempo"]
    lines = ["**Acoustic evidence**", "",
             f"- duration: {ev['duration_s']} s",
             (f"- loudness: mean {loud['mean_db']} dBFS, peak {loud['peak_db']} dBFS "
              f"(first half {loud['first_half_db']}, second half {loud['second_half_db']})"),
             f"- pitch: median {pitch['median_hz'] if pitch['median_hz'] is not None else '—'} Hz",
             f"- sounds (onsets): {ev['onset_count']}"
             + (f" at {', '.join(f'{t:.2f}' for t in ev['onset_times_s'][:12])} s"
                if ev["onset_times_s"] else ""),
             (f"- tempo: {tempo['bpm'] if tempo['bpm'] is not None else '—'} onsets/min "
              f"(rate {tempo['first_half_rate']} then {tempo['second_half_rate']} per s)"),
             f"- spectral centroid: {ev['spectral_centroid_hz']} Hz"]
    if ev["events"]:
        lines += ["", "| # | start s | end s | pitch Hz | level dB |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {e['start_s']} | {e['end_s']} | {e['pitch_hz']} | {e['loudness_db']} |"
                  for k, e in enumerate(ev["events"][:12], 1)]
    lines += ["", "<details><summary>raw evidence (JSON)</summary>", "",
              "```json", json.dumps(ev, indent=1), "```", "</details>"]
    return "\n".join(lines)


def rubric_rows(rubrics: list[dict[str, Any]], text: str) -> tuple[list[list[Any]], float]:
    """Each static rubric checked against the completion's reasoning: (rows, weighted score)."""
    from rewards.rubric_judges import JudgeError, check_satisfied, reasoning_of

    reasoning = reasoning_of(text)
    rows, total = [], 0.0
    for r in rubrics:
        try:
            ok = check_satisfied(r.get("check"), reasoning)
        except JudgeError:
            ok = None
        if ok:
            total += r["weight"]
        rows.append([r["criterion"], r["category"], round(r["weight"], 3),
                     "—" if ok is None else ("✓" if ok else "✗")])
    rows.insert(0, ["rubric reward (weighted sum of satisfied)", "", 1.0, round(total, 3)])
    return rows, total


def answer(ctx: DemoContext, audio: Any, question: str, sample: bool = False,
           temperature: float = 1.0, max_new_tokens: int = 128) -> Iterator[Update]:
    """The Audio QA handler: yields updates while the answer streams; never raises."""
    from apps.vision_tab import stream_completion

    text, n_tokens = "", 0
    evidence_md = ""
    try:
        rate, samples = check_audio(audio)
        question = check_question(question)
        reason = ctx.unavailable("audio", "Audio QA")
        if reason:
            yield "", "", [], reason
            return
        from rewards.audio_evidence import evidence_for, static_rubrics

        policy = ctx.policy
        clip, sr, note = model_clip(policy, rate, samples)
        evidence = evidence_for((samples, rate))
        evidence_md = evidence_markdown(evidence)
        rubrics = static_rubrics(evidence, question)
        example = Example(id="demo", prompt=question, answer="-", audios=[(clip, sr)])
        with ctx.lock:
            yield "", evidence_md, [], f"Generating… ({note})"
            stream = stream_completion(policy, example, sample=bool(sample),
                                       temperature=float(temperature),
                                       max_new_tokens=int(max_new_tokens),
                                       system_prompt=ctx.system_prompt,
                                       format_prompt=ctx.format_prompt)
            with closing(stream):  # a closed page stops generation before the lock is freed
                for text, n_tokens in stream:
                    yield text, evidence_md, [], "Generating…"
        rows, total = rubric_rows(rubrics, text)
        status = (f"✓ done: {n_tokens} tokens, {'sampled' if sample else 'greedy'} ({note}); "
                  f"static rubric reward {total:.3f}")
        if not text:
            status += " — the model ended at once and produced no text"
        yield text, evidence_md, rows, status
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        message = explain(err)
        if not isinstance(err, UserError):
            warn(message)
        yield text, evidence_md, [], message


def build(ctx: DemoContext) -> None:
    import gradio as gr

    reason = ctx.unavailable("audio", "Audio QA")
    if reason:
        gr.Markdown(f"**{reason}**", elem_id="audio-unavailable")
    with gr.Row():
        with gr.Column():
            audio = gr.Audio(sources=["upload", "microphone"], type="filepath", label="audio",
                             elem_id="audio-input")
            question = gr.Textbox(label="question", lines=2, elem_id="audio-question",
                                  placeholder="How many beeps are in the clip?")
            with gr.Row():
                sample = gr.Checkbox(label="sample (otherwise greedy)", value=False)
                temperature = gr.Slider(0.1, 2.0, value=1.0, step=0.1, label="temperature")
                max_new = gr.Slider(8, 2048, value=128, step=8, label="max new tokens")
            submit = gr.Button("Ask", variant="primary", elem_id="audio-submit",
                               interactive=reason is None)
        with gr.Column():
            status = gr.Markdown(elem_id="audio-status")
            answer_box = gr.Textbox(label="reasoning and answer (streamed)", lines=8,
                                    elem_id="audio-completion")
            evidence = gr.Markdown(elem_id="audio-evidence")
            rubric = gr.Dataframe(headers=RUBRIC_HEADERS, label="static rubric scores",
                                  interactive=False)

    def on_ask(audio, question, sample, temperature, max_new):
        yield from answer(ctx, audio, question, sample, temperature, max_new)

    submit.click(on_ask, [audio, question, sample, temperature, max_new],
                 [answer_box, evidence, rubric, status], api_name="audio_answer")
