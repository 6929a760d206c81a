"""Tool use: one multi-turn trajectory of the trained model, shown turn by turn.

The question and its image or clip go through the same multi-turn engine a GRPO step uses
(`mmrlvr.rollout.multiturn.MultiTurnEngine` around the `hf` engine, docs/tools.md), with the
run's tools (`rollout.tools` of its `config.yaml`; without any, the built-in tool for the
model's medium: `zoom` for images, `clip` for audio), its `max_turns` and
`max_trajectory_tokens`. The tools run under the same runner (timeout, errors become the tool
turn), watched here so that each tool result appears as soon as it comes back: the policy's call,
then what the tool returned (text, the image it made, the audio clip it cut, or the error the
policy was shown), then the next turn. When the trajectory ends, every turn is shown with the
text the policy wrote, and the final answer with the verifier's verdict; the trajectory as the
rewards see it (`Trajectory.as_dict`) is one click away.

The page updates at each tool result and once a second while a turn is written, not per token:
a client that leaves is noticed within a second, no tool runs after that, and the turn being
written is the last, so the next request waits at most one turn of `max new tokens`.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from apps.common import (MAX_GOLD_CHARS, MAX_QUESTION_CHARS, DemoContext, UserError,
                         check_question, check_text, explain, warn)
from apps.verdicts import listed_choices, verdict
from mmrlvr.data import Example
from mmrlvr.tools import Tool, ToolRunner, build_runner

BUILTIN = {"vision": {"name": "zoom"}, "audio": {"name": "clip"}}
"""The tool a model gets when its run configures none: one on its own medium."""
MAX_RECORDING_S = 600.0
"""Longest uploaded recording (a tool's audio result may be as long: `mmrlvr.tools.runner`)."""
MAX_TURNS = 6
MAX_NEW_TOKENS = 512
"""Caps on the sliders (and on what a client may send): the page waits a turn at most."""
TICK_S = 1.0
"""Seconds between the page's updates while a turn is written (the status counts them)."""
Update = list[Any]
"""chat messages, trajectory (JSON), status markdown."""


class Stopped(Exception):
    """The client left: no further tool runs."""


class WatchedRunner(ToolRunner):
    """The run's tools, reporting each turn's calls and results (media included) to `events`."""

    def __init__(self, tools: list[Tool], events: queue.Queue):
        super().__init__(tools)
        self.events, self.stop = events, threading.Event()
        self.results: list[Any] = []

    def run_all(self, calls: list[tuple[Any, Any]]) -> list[Any]:
        if self.stop.is_set():
            raise Stopped()
        results = super().run_all(calls)
        for (_, call), result in zip(calls, results):
            self.results.append((call, result))
            self.events.put(("result", call, result))
        return results


def tool_specs(ctx: DemoContext) -> tuple[list[dict[str, Any]], int, int]:
    """(tools, max_turns, max_trajectory_tokens) of the run, or the built-in tool for the
    loaded model's medium with 3 turns."""
    rollout = ctx.info.config.get("rollout") or {}
    tools = rollout.get("tools") or ([BUILTIN[ctx.modality]] if ctx.modality in BUILTIN else [])
    turns = int(rollout.get("max_turns") or 1) if rollout.get("tools") else 3
    return list(tools), max(2, turns), int(rollout.get("max_trajectory_tokens") or 0)


def call_line(call: Any) -> str:
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in call.arguments.items())
    return f"{call.name}({args})"


def media_message(result: Any) -> dict[str, Any] | None:
    """A tool's image or audio clip as a chat message (None for text and errors)."""
    import gradio as gr

    if result.kind == "image":
        return {"role": "assistant", "content": gr.Image(result.image, label="tool image")}
    if result.kind == "audio":
        import numpy as np

        wave, rate = result.audio
        # int16 as it is: Gradio scales float audio to full scale, which would turn a quiet
        # clip loud (the clip task asks exactly that)
        pcm = (np.clip(wave, -1.0, 1.0) * 32767).astype(np.int16)
        return {"role": "assistant", "content": gr.Audio((rate, pcm), label="tool audio")}
    return None


def result_text(result: Any) -> str:
    if result.kind == "error":
        return f"⚠ the tool failed; the policy was shown `error: {result.error}`"
    if result.kind == "image":
        return f"an image of {result.image.width}×{result.image.height} px" + (
            f": {result.text}" if result.text else "")
    if result.kind == "audio":
        wave, rate = result.audio
        return f"an audio clip of {len(wave) / rate:.2f} s at {rate} Hz" + (
            f": {result.text}" if result.text else "")
    return f"```\n{result.text}\n```"


def tool_messages(k: int, call: Any, result: Any) -> list[dict[str, Any]]:
    """Turn `k`'s tool call and what it gave: a titled note, then the medium if any."""
    out = [{"role": "assistant", "content": result_text(result),
            "metadata": {"title": f"🛠 turn {k}: {call_line(call)} → {result.kind}",
                         "status": "done"}}]
    medium = media_message(result)
    return out + ([medium] if medium else [])


def prompt_messages(example: Example, note: str) -> list[dict[str, Any]]:
    import gradio as gr

    out: list[dict[str, Any]] = [{"role": "user", "content": example.prompt}]
    for image in example.images:
        out.append({"role": "user", "content": gr.Image(image, label="prompt image")})
    for audio in example.audios:
        out.append({"role": "user", "content": gr.Audio(audio, label="prompt audio")})
    if note:
        out.append({"role": "user", "content": note})
    return out


def turn_messages(traj: Any, watched: list[tuple[Any, Any]], example: Example
                  ) -> list[dict[str, Any]]:
    """The whole trajectory: each policy turn as written, its tool call and result, the answer."""
    out, media = [], iter(watched)
    for k, turn in enumerate(traj.turns, 1):
        last = k == len(traj.turns) and turn.call is None and not turn.call_error
        title = "final answer" if last else f"turn {k}: the policy"
        out.append({"role": "assistant", "content": f"```\n{turn.text}\n```",
                    "metadata": {"title": f"{title} ({len(turn.text)} characters)"}})
        if last and example.answer != "-":
            out.append({"role": "assistant", "content": verdict(example, turn.text)})
        if turn.call is not None and turn.result_kind and turn.result_kind != "error":
            call, result = next(media)
            out += tool_messages(k, call, result)
        elif turn.result_kind:          # a refused or failed call: the message the policy saw
            if turn.call is not None:
                next(media)
            what = call_line(turn.call) if turn.call is not None else "a malformed call"
            title = f"🛠 turn {k}: {what} → error"
            out.append({"role": "assistant", "content": f"⚠ `{turn.result_text}`",
                        "metadata": {"title": title, "status": "done"}})
    return out


def recording_seconds(path: Any) -> float:
    """An uploaded recording's length, or a UserError: unlike Audio QA's clip it may outlast the
    model's window (what `clip` is for), up to `MAX_RECORDING_S`."""
    import warnings

    from mmrlvr.data import DataError, read_audio

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            samples = read_audio(str(path), 16000, sample="upload")
    except DataError as err:
        raise UserError(f"{Path(str(path)).name} cannot be used as audio: "
                        f"{str(err).split(': ', 2)[-1]}. Upload a WAV, FLAC, MP3 or OGG clip."
                        ) from None
    seconds = samples.size / 16000
    if seconds > MAX_RECORDING_S:
        raise UserError(f"The recording is {seconds:.0f} s long; the tools take at most "
                        f"{MAX_RECORDING_S:.0f} s — trim it.")
    return seconds


def check_media(ctx: DemoContext, media: Any) -> tuple[list[str], list[str], str]:
    """(images, audios, note) of an upload for the loaded model's medium; the file as given:
    the tools read it at the resolution stored (the prompt gets it resized or cut)."""
    if isinstance(media, dict):          # gradio FileData as a dict (API callers)
        media = media.get("path")
    if not media or not Path(str(media)).is_file():
        raise UserError("Upload an image or a clip first (or click an example).")
    if ctx.modality == "audio":
        seconds = recording_seconds(media)
        window = ctx.policy.processor.feature_extractor.chunk_length
        note = (f"*the model hears the first {window:g} s of this {seconds:.1f} s clip*"
                if seconds > window else "")
        return [], [str(media)], note
    from apps.common import open_image

    image = open_image(str(media), "the image")
    shown = ctx.policy.adapter.load_image(image, Example(id="demo", prompt="", answer=""),
                                          ctx.policy.processor)
    note = (f"*the model sees this {image.width}×{image.height} image at "
            f"{shown.width}×{shown.height}*" if shown.size != image.size else "")
    return [str(media)], [], note


def _engine(ctx: DemoContext, runner: ToolRunner, max_turns: int, budget: int) -> Any:
    from mmrlvr.rollout import make_engine
    from mmrlvr.rollout.multiturn import MultiTurnEngine

    return MultiTurnEngine(make_engine("hf", ctx.policy), ctx.policy, runner, max_turns, budget)


def run(ctx: DemoContext, media: Any, question: str, gold: str = "", sample: bool = False,
        temperature: float = 1.0, max_new_tokens: int = 64, max_turns: int = 0
        ) -> Iterator[Update]:
    """The Tool use handler: yields the chat after each tool call and at the end; never raises."""
    reason = ctx.unavailable(ctx.modality or "vision", "Tool use")
    if reason:
        yield [[], {}, reason]
        return
    try:
        question = check_question(question)
        gold = check_text(gold, "the gold answer", MAX_GOLD_CHARS)
        specs, run_turns, budget = tool_specs(ctx)
        if not specs:
            raise UserError(f"The {ctx.modality} model has no tool to call here: the run "
                            "configures no `rollout.tools`.")
        turns = min(MAX_TURNS, max(2, int(max_turns or run_turns)))
        images, audios, note = check_media(ctx, media)
        example = Example(id="demo", prompt=question, answer=gold or "-", images=images,
                          audios=audios, choices=listed_choices(question))
        yield from _trajectory(ctx, example, specs, note, turns, budget, bool(sample),
                               float(temperature), min(MAX_NEW_TOKENS, int(max_new_tokens)))
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        message = explain(err)
        if not isinstance(err, UserError):
            warn(message)
        yield [[], {}, message]


def _trajectory(ctx: DemoContext, example: Example, specs: list[dict[str, Any]], note: str,
                turns: int, budget: int, sample: bool, temperature: float, max_new: int
                ) -> Iterator[Update]:
    from mmrlvr.rollout import SamplingParams

    events: queue.Queue = queue.Queue()
    runner = WatchedRunner(list(build_runner(specs).tools.values()), events)
    names = ", ".join(runner.names)
    chat = prompt_messages(example, note)
    yield [chat, {}, f"Turn 1 of at most {turns}… (tools: {names})"]
    params = SamplingParams(n=1, max_new_tokens=max_new, temperature=temperature,
                            greedy=not sample)
    box: list[Any] = []

    def work() -> None:
        try:
            batch = ctx.prompting().encode(ctx.policy, [example])
            box.append(_engine(ctx, runner, turns, budget).generate(batch, params))
        except BaseException as err:  # noqa: BLE001 — re-raised by the reader below
            box.append(err)
        events.put(("end",))

    with ctx.lock:
        thread = threading.Thread(target=work, name="demo-trajectory", daemon=True)
        thread.start()
        try:
            live, line, t0 = list(chat), f"Turn 1 of at most {turns}…", time.monotonic()
            while True:
                try:
                    event = events.get(timeout=TICK_S)
                except queue.Empty:         # an update a second: a client gone is noticed
                    yield [live, {}, f"{line} {time.monotonic() - t0:.0f} s"]
                    continue
                if event[0] == "end":
                    break
                _, call, result = event
                k = len(runner.results)
                live += tool_messages(k, call, result)
                line = f"Turn {k + 1} of at most {turns}… (called {call_line(call)})"
                yield [live, {}, line]
        finally:
            runner.stop.set()
            thread.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    traj = box[0].texts[0].trajectory
    calls = len(runner.results)
    status = (f"✓ done: {len(traj.turns)} turn{'s' * (len(traj.turns) != 1)}, {calls} tool "
              f"call{'s' * (calls != 1)}, ended: {traj.ended} "
              f"({'sampled' if sample else 'greedy'}; tools: {names})")
    if not calls:
        status += " — the model answered without calling a tool"
    yield [chat + turn_messages(traj, runner.results, example), traj.as_dict(), status]


def pick_example(ctx: DemoContext, index: Any) -> list[Any]:
    ex = ctx.info.examples[int(index)]
    media = (ex.audios or ex.images or [None])[0]
    return [media if isinstance(media, str) else None, ex.prompt, ex.answer]


def build(ctx: DemoContext) -> None:
    import gradio as gr

    from apps.panels import example_table

    reason = ctx.unavailable(ctx.modality or "vision", "Tool use")
    specs = tool_specs(ctx)[0] if not reason else []
    if not reason and not specs:
        reason = f"Tool use: the {ctx.modality} model has no built-in tool and the run names none."
    ready = reason is None
    if reason:
        gr.Markdown(f"⚠ {reason}", elem_id="tools-unavailable", elem_classes=["unavailable"])
    else:
        listed = ", ".join(f"`{spec['name']}`" for spec in specs)
        gr.Markdown(f"Tools: {listed}. One trajectory of the trained model, turn by turn: each "
                    "call, what the tool returned, the answer.", elem_classes=["note"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=360):
            media = gr.File(label="image or clip", type="filepath", elem_id="tools-media",
                            interactive=ready)
            question = gr.Textbox(label="question (Enter asks)", lines=1, max_lines=6,
                                  elem_id="tools-question", interactive=ready,
                                  max_length=MAX_QUESTION_CHARS)
            gold = gr.Textbox(label="gold answer (optional: gives the final answer's verdict)",
                              elem_id="tools-gold", interactive=ready, max_length=MAX_GOLD_CHARS)
            submit = gr.Button("Run", variant="primary", elem_id="tools-submit", interactive=ready)
            status = gr.Markdown(elem_id="tools-status", elem_classes=["status"])
            with gr.Accordion("generation settings", open=False):
                sample = gr.Checkbox(label="sample (otherwise greedy)", value=False)
                temperature = gr.Slider(0.1, 2.0, value=1.0, step=0.1, label="temperature")
                max_new = gr.Slider(8, MAX_NEW_TOKENS, value=64, step=8,
                                    label="max new tokens per turn")
                turns = gr.Slider(2, MAX_TURNS, value=tool_specs(ctx)[1] if ready else 2, step=1,
                                  label="max turns")
            examples = example_table(ctx, ctx.modality, ready, elem="tools")
        with gr.Column(scale=7, min_width=420, visible=ready):
            chat = gr.Chatbot(label="trajectory", elem_id="tools-chat", height=560)
            with gr.Accordion("the trajectory as rewards see it", open=False):
                raw = gr.JSON(elem_id="tools-trajectory")

    def on_run(media, question, gold, sample, temperature, max_new, turns):
        yield from run(ctx, media, question, gold, sample, temperature, max_new, turns)

    inputs = [media, question, gold, sample, temperature, max_new, turns]
    submit.click(on_run, inputs, [chat, raw, status], api_name="tools_run", show_progress="hidden")
    question.submit(on_run, inputs, [chat, raw, status], api_name="tools_run_enter",
                    show_progress="hidden")
    if examples is not None:
        examples.click(lambda i: pick_example(ctx, i), examples, [media, question, gold],
                       api_name="tools_example", show_progress="hidden")
