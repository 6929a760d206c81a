"""Audio QA: upload or microphone → streamed answers (trained beside base), evidence, rubrics.

The clip (a file Gradio saved, or a `(sample_rate, samples)` pair) is checked (empty, silent,
over-long, undecodable → a message), resampled to the feature extractor's rate and cut to the
model's window, then asked through the audio adapter token by token (`apps.generate`: `encode` +
`generation_inputs`, so the clip is encoded once), into the panels of `apps.panels`. Before the
answers stream, the tab shows the clip's acoustic evidence
(`mmrlvr.methods.audio_rubrics.evidence.extract_evidence`); when they end, the static rubrics written from that
evidence (`static_rubrics`) are checked against each answer's reasoning by the rule-based judge
(`mmrlvr.methods.audio_rubrics.judges.check_satisfied`), the static fallback of the AudioRubrics reward. A
multiple-choice question (options as `A. …` lines) with a gold letter or option gets the
verifier's verdict. Clearing the clip clears the results.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from apps.common import (MAX_GOLD_CHARS, MAX_QUESTION_CHARS, DemoContext, UserError,
                         check_question, check_text, explain, warn)
from apps.panels import (NO_GOLD, ask_models, build_panels, empty_panel, example_table,
                         panel_values)
from apps.verdicts import listed_choices
from mmrlvr.data import DataError, Example

MAX_SECONDS = 30.0
"""Longest clip: the window Qwen2-Audio's feature extractor reads."""
SILENCE_PEAK = 1e-3
"""A clip whose loudest sample is below this (full scale 1.0) counts as silent."""
READ_RATE = 16000
"""Rate an uploaded file is decoded at (Qwen2-Audio's; the evidence is computed at it too)."""
RUBRIC_WIDTHS = {4: ["50%", "18%", "14%", "18%"], 5: ["46%", "16%", "12%", "13%", "13%"]}
"""Rubric table columns by count (with and without the base model): the criterion wraps."""
Update = list[Any]
"""trained panel (answer, verdict, reasoning, raw), base panel, evidence markdown, rubric rows,
status markdown."""


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
             f"- pitch: median {'—' if pitch['median_hz'] is None else pitch['median_hz']} Hz",
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


def rubric_headers(ctx: DemoContext) -> list[str]:
    return ["rubric", "category", "weight",
            *(["trained", "base"] if ctx.base is not None else ["satisfied"])]


def rubric_rows(rubrics: list[dict[str, Any]], texts: list[str | None]
                ) -> tuple[list[list[Any]], list[float]]:
    """Each static rubric checked against each completion's reasoning ("—" for a model not
    asked): (rows, weighted score per completion)."""
    from mmrlvr.methods.audio_rubrics.judges import JudgeError, check_satisfied, reasoning_of

    reasonings = [None if t is None else reasoning_of(t) for t in texts]
    rows, totals = [], [0.0] * len(texts)
    for r in rubrics:
        marks = []
        for k, reasoning in enumerate(reasonings):
            if reasoning is None:
                marks.append("—")
                continue
            try:
                ok = check_satisfied(r.get("check"), reasoning)
            except JudgeError:
                ok = None
            totals[k] += r["weight"] if ok else 0.0
            marks.append("—" if ok is None else ("✓" if ok else "✗"))
        rows.append([r["criterion"], r["category"], round(r["weight"], 3), *marks])
    rows.insert(0, ["rubric reward (weighted sum of the satisfied rubrics below)", "", 1.0,
                    *("—" if t is None else round(v, 3) for t, v in zip(texts, totals))])
    return rows, totals


def answer(ctx: DemoContext, audio: Any, question: str, gold: str = "", sample: bool = False,
           temperature: float = 1.0, max_new_tokens: int = 128,
           compare: bool = True) -> Iterator[Update]:
    """The Audio QA handler: yields updates while the answers stream; never raises."""
    panels = [empty_panel(), empty_panel()]
    evidence_md = ""
    try:
        rate, samples = check_audio(audio)
        question = check_question(question)
        gold = check_text(gold, "the gold answer", MAX_GOLD_CHARS)
        reason = ctx.unavailable("audio", "Audio QA")
        if reason:
            yield [*panels[0], *panels[1], "", [], reason]
            return
        from mmrlvr.methods.audio_rubrics.evidence import evidence_for, static_rubrics

        clip, sr, note = model_clip(ctx.policy, rate, samples)
        evidence = evidence_for((samples, rate))
        evidence_md = evidence_markdown(evidence)
        rubrics = static_rubrics(evidence, question)
        example = Example(id="demo", prompt=question, answer=gold or "-", audios=[(clip, sr)],
                          choices=listed_choices(question))
        compare = bool(compare) and ctx.base is not None
        names = ["trained model", "base model"]
        texts: list[str | None] = [None, None]
        counts = [0, 0]
        if compare:
            panels[1] = empty_panel("*waiting for the trained model…*")
        yield [*panels[0], *panels[1], evidence_md, [], f"Generating… ({note})"]
        for k, text, n_tokens, done in ask_models(
                ctx, example, compare=compare, sample=bool(sample),
                temperature=float(temperature), max_new_tokens=int(max_new_tokens),
                format_prompt=ctx.format_prompt):
            panels[k] = panel_values(text, example if gold else None, done)
            counts[k] = n_tokens
            if done:
                texts[k] = text
            yield [*panels[0], *panels[1], evidence_md, [],
                   f"Generating with the {names[k]}… {n_tokens} tokens"]
        rows, totals = rubric_rows(rubrics, texts[:2 if ctx.base is not None else 1])
        made = f"trained {counts[0]} tokens" + (f", base {counts[1]}" if compare else "")
        reward = f"static rubric reward {totals[0]:.3f}" + (
            f" (base {totals[1]:.3f})" if compare else "")
        status = (f"✓ done: {made}, {'sampled' if sample else 'greedy'} ({note}); {reward}")
        if not texts[0]:
            status += " — the trained model ended at once and produced no text"
        if not gold and example.choices:
            status += ". " + NO_GOLD
        yield [*panels[0], *panels[1], evidence_md, rows, status]
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        message = explain(err)
        if not isinstance(err, UserError):
            warn(message)
        yield [*panels[0], *panels[1], evidence_md, [], message]


def cleared(audio: Any) -> list[Any]:
    """Results of an earlier clip are gone once the clip is cleared or replaced."""
    note = ("Clip cleared: upload or record another." if audio is None else
            "Clip ready: press **Ask** (or Enter in the question).")
    return [*empty_panel(), *empty_panel(), "", [], note]


def pick_example(ctx: DemoContext, index: Any) -> list[Any]:
    ex = ctx.info.examples[int(index)]
    return [ex.audios[0], ex.prompt, ex.answer]


def build(ctx: DemoContext) -> None:
    import gradio as gr

    reason = ctx.unavailable("audio", "Audio QA")
    ready = reason is None
    if reason:
        gr.Markdown(f"⚠ {reason}", elem_id="audio-unavailable", elem_classes=["unavailable"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=360):
            audio = gr.Audio(sources=["upload", "microphone"], type="filepath", label="clip",
                             elem_id="audio-input", interactive=ready)
            question = gr.Textbox(label="question (Enter asks; options as `A. …` lines)",
                                  lines=1, max_lines=6, elem_id="audio-question",
                                  interactive=ready, max_length=MAX_QUESTION_CHARS,
                                  placeholder="How many beeps are in the clip?")
            gold = gr.Textbox(label="gold answer (optional: a letter or option text gives the "
                                    "verdict)", elem_id="audio-gold", interactive=ready,
                              max_length=MAX_GOLD_CHARS)
            with gr.Row():
                submit = gr.Button("Ask", variant="primary", elem_id="audio-submit",
                                   interactive=ready, scale=2)
                compare = gr.Checkbox(label="compare with the base model", value=True,
                                      visible=ctx.base is not None and ready, scale=1)
            status = gr.Markdown(elem_id="audio-status", elem_classes=["status"])
            with gr.Accordion("generation settings", open=False):
                with gr.Row():
                    sample = gr.Checkbox(label="sample (otherwise greedy)", value=False,
                                         elem_id="audio-sample")
                    temperature = gr.Slider(0.1, 2.0, value=1.0, step=0.1, label="temperature")
                    max_new = gr.Slider(8, 2048, value=128, step=8, label="max new tokens",
                                        elem_id="audio-max-new")
            examples = example_table(ctx, "audio", ready)
        with gr.Column(scale=7, min_width=420, visible=ready):
            trained, base = build_panels("audio", ctx)
            rubric = gr.Dataframe(headers=rubric_headers(ctx), label="static rubric scores",
                                  interactive=False, wrap=True, max_height=420,
                                  elem_id="audio-rubrics", elem_classes=["plain-table"],
                                  column_widths=RUBRIC_WIDTHS[len(rubric_headers(ctx))])
            with gr.Accordion("acoustic evidence", open=False):
                evidence = gr.Markdown(elem_id="audio-evidence")

    def on_ask(audio, question, gold, sample, temperature, max_new, compare):
        yield from answer(ctx, audio, question, gold, sample, temperature, max_new, compare)

    outputs = [*trained.outputs(), *base.outputs(), evidence, rubric, status]
    inputs = [audio, question, gold, sample, temperature, max_new, compare]
    submit.click(on_ask, inputs, outputs, api_name="audio_answer", show_progress="hidden")
    question.submit(on_ask, inputs, outputs, api_name="audio_answer_enter",
                    show_progress="hidden")
    audio.change(cleared, audio, outputs, api_name="audio_cleared", show_progress="hidden")
    if examples is not None:
        examples.click(lambda i: pick_example(ctx, i), examples, [audio, question, gold],
                       api_name="audio_example", show_progress="hidden")
