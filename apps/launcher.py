"""`mmrlvr demo`: one Gradio Blocks app with a tab per use, for a trained model and/or a run.

    mmrlvr demo --model runs/quickstart/final --run runs/quickstart --port 7860

The page opens on the tab the loaded model serves (the monitor without a model); the other tabs
say which command would load a model for them. The header says what the model was trained on
and how far the run moved it; a dropdown switches between the run's `final` model and its
`checkpoints/step-N`. With a run dir, answers are compared with the run's starting model
(`--compare BASE_DIR` names another; `--compare none` turns it off). The prompt settings and the
image size bounds come from the run's `config.yaml` (the `--run` dir's, or the one above the
model dir; bounds it leaves at 0 are the model processor's), so the model is asked the way it was
trained.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from apps import audio_tab, monitor_tab, robustness_tab, tools_tab, translation_tab, vision_tab
from apps.common import DemoContext, explain
from apps.runinfo import read_run, run_line, task_line
from mmrlvr.train.policy import PolicyError

MAX_FILE_SIZE = "50mb"
"""Largest upload the server accepts (Gradio refuses bigger ones with a visible message)."""
TAB_OF = {"vision": "vision", "audio": "audio", "image_translation": "translation"}
CSS = """
.final-answer p { font-size: 1.15em; margin: 0.2em 0; }
.status p, .note p { margin: 0.2em 0; }
.panel-title h4 { margin: 0; }
#demo-header p { margin: 0.1em 0; }
.unavailable { background: #fff4e5; border: 1px solid #f5c27a; border-radius: 6px;
               padding: 0.5em 0.8em !important; }
.examples td { padding: 2px 8px !important; }
.plain-table { --font-mono: var(--font); }
.examples td .container { width: 44px !important; height: 44px !important; }
.examples td img { max-height: 40px !important; object-fit: contain; }
"""
"""Compact example rows, answers that stand out, unavailable-tab notes that read as notes."""


def model_modality(model: str) -> str:
    """The adapter a model dir implies: its family's (`mmrlvr.models`: `audio` for Qwen2-Audio
    and the Omni thinkers), else `vision`.

    (An image-translation model is a vision model: that adapter comes from the run config or
    `--modality image_translation`.)
    """
    from mmrlvr import models

    try:
        return models.resolve(str(Path(model).expanduser())).modality
    except models.FamilyError:          # not a model dir (yet), or no family: Policy.load says so
        return "vision"


VIDEO_KEYS = ("video_fps", "max_frames", "max_video_pixels")
"""The run's `data` settings that say how a video is sampled (the demo samples as it trained)."""


def load_policy(config: Any, path: str, device: Any, video: dict[str, Any] | None = None) -> Any:
    """The model at `path` loaded like `config` (same adapter, pixel bounds, dtype), sampling
    videos as `video` says (the run's `data.video_fps`, `max_frames`, `max_video_pixels`)."""
    import dataclasses

    import modalities
    from mmrlvr.train.policy import Policy

    config = dataclasses.replace(config, path=path)
    adapter = modalities.get(config.modality, min_pixels=config.min_pixels,
                             max_pixels=config.max_pixels, **(video or {}))
    return Policy.load(config, adapter, device)


def load_context(model: str | None = None, run: str | None = None, device: str = "auto",
                 min_pixels: int | None = None, max_pixels: int | None = None,
                 modality: str | None = None, compare: str | None = None) -> DemoContext:
    """Load the model (if any) with the run's prompt settings and image size bounds, and the
    model to compare it with: `compare`, else the run's starting model (`none`: no comparison).

    The adapter is `modality` when given, else the run config's `model.modality`, else the one
    the model's config implies (`model_modality`).
    """
    if model and model.startswith(("/", ".", "~")) and not Path(model).expanduser().exists():
        raise PolicyError(f"model dir {model} does not exist; give a model dir written by "
                          "`mmrlvr train`/`sft` (e.g. runs/NAME/final) or a hub id")
    model = str(Path(model).expanduser()) if model and model.startswith("~") else model
    probe = read_run(run, model)
    mcfg = probe.config.get("model") or {}
    chosen = modality or mcfg.get("modality") or (model_modality(model) if model else "vision")
    info = read_run(run, model, chosen)
    data = info.config.get("data") or {}
    ctx = DemoContext(model_path=model or "", run_dir=str(info.run_dir or run or ""), info=info,
                      system_prompt=data.get("system_prompt") or "",
                      format_prompt=data.get("format_prompt") or "")
    if not model:
        return ctx
    from mmrlvr.config import ModelConfig, model_defaults
    from mmrlvr.train.policy import pick_device

    own = model_defaults(model)       # the model processor's bounds, where flag and run are silent
    ctx.model_config = ModelConfig(
        path=model, modality=chosen,
        min_pixels=min_pixels or mcfg.get("min_pixels") or own.min_pixels,
        max_pixels=max_pixels or mcfg.get("max_pixels") or own.max_pixels)
    dev = pick_device(device)
    ctx.video = {k: data[k] for k in VIDEO_KEYS if data.get(k)}
    ctx.policy = load_policy(ctx.model_config, model, dev, ctx.video)
    base = info.start_model if compare is None else ("" if compare == "none" else compare)
    local = Path(base).expanduser().exists() if base else False
    if compare not in (None, "none") and not local and compare.startswith(("/", ".", "~")):
        raise PolicyError(f"--compare {compare}: no such model dir")
    if base and (local or compare is not None) and \
            Path(base).expanduser().resolve() != Path(model).expanduser().resolve():
        ctx.base, ctx.base_path = load_policy(ctx.model_config, base, dev, ctx.video), base
    return ctx


def header(ctx: DemoContext) -> str:
    """What is loaded, what it was trained on, how far the run moved it (markdown)."""
    lines = ["## mmrlvr demo"]
    if ctx.policy is not None:
        n = sum(p.numel() for p in ctx.policy.model.parameters())
        size = f"{n / 1e6:.1f} M" if n < 1e9 else f"{n / 1e9:.1f} B"
        kind = type(ctx.policy.base_model()).__name__.removesuffix("ForConditionalGeneration")
        line = f"Model: `{ctx.model_path}` ({kind}, {size} parameters, `{ctx.modality}` adapter)"
        if ctx.base is not None:
            line += f", compared with the base model `{ctx.base_path}`"
        elif ctx.info.start_model and not Path(ctx.info.start_model).exists():
            line += (f"; the run's starting model `{ctx.info.start_model}` is not on this "
                     "machine (`--compare DIR` names a model to compare with)")
        lines.append(line + ".")
    else:
        lines.append("No model loaded (`--model DIR`): only the training monitor works.")
    lines += [t for t in (task_line(ctx.info), run_line(ctx.info)) if t]
    return "\n\n".join(lines)


def switch_checkpoint(ctx: DemoContext, label: str) -> str:
    """Load the run's `final` or `step-N` model in place of the trained one; a status line."""
    paths = dict(ctx.info.checkpoints())
    if label not in paths or ctx.policy is None:
        return f"⚠ No checkpoint `{label}` in `{ctx.run_dir}`."
    try:
        policy = load_policy(ctx.model_config, paths[label], ctx.policy.device, ctx.video)
    except Exception as err:  # noqa: BLE001 — a bad checkpoint leaves the loaded model in place
        return explain(err)
    with ctx.lock:                       # not in the middle of someone's answer
        ctx.policy, ctx.model_path = policy, paths[label]
    return f"✓ Now answering with `{paths[label]}` ({label})."


def build_demo(ctx: DemoContext) -> Any:
    """The Blocks app: Vision QA, Audio QA, Image translation, Tool use, Robustness, Training
    monitor."""
    import gradio as gr

    with gr.Blocks(title="mmrlvr demo") as demo:
        with gr.Row(equal_height=False):
            gr.Markdown(header(ctx), elem_id="demo-header")
            choices = [label for label, _ in ctx.info.checkpoints()]
            if ctx.policy is not None and len(choices) > 1:
                with gr.Column(scale=0, min_width=220):
                    current = next((label for label, path in ctx.info.checkpoints()
                                    if Path(path).resolve() == Path(ctx.model_path).resolve()),
                                   None)
                    pick = gr.Dropdown(choices, value=current, label="trained model: checkpoint",
                                       elem_id="checkpoint")
                    picked = gr.Markdown(elem_id="checkpoint-status")
                pick.change(lambda label: switch_checkpoint(ctx, label), pick, picked,
                            api_name="checkpoint")
        with gr.Tabs(selected=TAB_OF.get(ctx.modality, "monitor")):
            with gr.Tab("Vision QA", id="vision"):
                vision_tab.build(ctx)
            with gr.Tab("Audio QA", id="audio"):
                audio_tab.build(ctx)
            with gr.Tab("Image translation", id="translation"):
                translation_tab.build(ctx)
            with gr.Tab("Tool use", id="tools"):
                tools_tab.build(ctx)
            with gr.Tab("Robustness", id="robustness"):
                robustness_tab.build(ctx)
            with gr.Tab("Training monitor", id="monitor"):
                monitor_tab.build(ctx.run_dir)
    return demo


def launch(demo: Any, host: str = "127.0.0.1", port: int | None = 7860, block: bool = True,
           allowed: list[str] | None = None) -> str:
    """Serve `demo`; returns its URL (at once when `block` is False, e.g. in tests). The
    `allowed` files may be served as they are (`media_files`: the examples' media); besides
    them Gradio serves only what it was sent or made (its upload and cache dirs).

    One event runs at a time (the tabs share the models). A client that leaves is noticed at
    its handler's next update, and every generating handler updates once per token, so the
    next request waits at most a token for a dead one; the caps on every text input bound the
    work before the first token."""
    demo.queue(default_concurrency_limit=1)
    _, url, _ = demo.launch(server_name=host, server_port=port, prevent_thread_lock=not block,
                            max_file_size=MAX_FILE_SIZE, ssr_mode=False, quiet=not block,
                            footer_links=["api"], allowed_paths=allowed or [], css=CSS)
    return url


def media_files(ctx: DemoContext) -> list[str]:
    """The examples' media files (a click hands them to the inputs), each by its own path: the
    dirs they lie in once were served whole, other files and the data with its gold answers
    beside them."""
    return sorted({str(Path(p).absolute()) for ex in ctx.info.examples
                   for p in [*ex.images, *ex.audios, *ex.videos]
                   if isinstance(p, str) and Path(p).is_file()})


def serve(model: str | None = None, run: str | None = None, host: str = "127.0.0.1",
          port: int = 7860, device: str = "auto", min_pixels: int | None = None,
          max_pixels: int | None = None, modality: str | None = None,
          compare: str | None = None) -> int:
    ctx = load_context(model, run, device, min_pixels, max_pixels, modality, compare)
    try:
        launch(build_demo(ctx), host=host, port=port, block=True, allowed=media_files(ctx))
    except OSError as err:  # the port is taken, or the host is not this machine's
        print(f"mmrlvr demo: error: cannot serve on {host}:{port}: {err} (try another --port)",
              file=sys.stderr)
        return 2
    return 0
