"""`mmrlvr demo`: one Gradio Blocks app with a tab per use, for a trained model and/or a run.

    mmrlvr demo --model runs/quickstart/final --run runs/quickstart --port 7860

Without `--model` only the training monitor works (the other tabs say so); without `--run` the
monitor asks for a run dir. The prompt settings (system and format prompt) and the image size
bounds come from the run's `config.yaml` (the `--run` dir's, or the one above the model dir), so
the model is asked the way it was trained.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from apps import audio_tab, monitor_tab, robustness_tab, translation_tab, vision_tab
from apps.common import DemoContext, run_config
from mmrlvr.train.policy import PolicyError

MAX_FILE_SIZE = "50mb"
"""Largest upload the server accepts (Gradio refuses bigger ones with a visible message)."""


def model_modality(model: str) -> str:
    """The adapter a model dir implies: `audio` for Qwen2-Audio / Qwen2.5-Omni, else `vision`.

    (An image-translation model is a vision model: that adapter comes from the run config or
    `--modality image_translation`.)
    """
    import json

    path = Path(model).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        config = {}
    kind = " ".join([str(config.get("model_type", "")), *map(str, config.get("architectures") or [])])
    return "audio" if "audio" in kind.lower() or "omni" in kind.lower() else "vision"


def load_context(model: str | None = None, run: str | None = None, device: str = "auto",
                 min_pixels: int | None = None, max_pixels: int | None = None,
                 modality: str | None = None) -> DemoContext:
    """Load the model (if any) with the run's prompt settings and image size bounds.

    The adapter is `modality` when given, else the run config's `model.modality`, else the one
    the model's config implies (`model_modality`).
    """
    cfg = run_config(run, model)
    data, mcfg = cfg.get("data") or {}, cfg.get("model") or {}
    ctx = DemoContext(model_path=model or "", run_dir=run or "",
                      system_prompt=data.get("system_prompt") or "",
                      format_prompt=data.get("format_prompt") or "")
    if model:
        if model.startswith(("/", ".", "~")) and not Path(model).expanduser().exists():
            raise PolicyError(f"model dir {model} does not exist; give a model dir written by "
                              "`mmrlvr train`/`sft` (e.g. runs/NAME/final) or a hub id")
        model = str(Path(model).expanduser()) if model.startswith("~") else model
        import modalities
        from mmrlvr.config import ModelConfig
        from mmrlvr.train.policy import Policy, pick_device

        defaults = ModelConfig()
        config = ModelConfig(
            path=model, modality=modality or mcfg.get("modality") or model_modality(model),
            min_pixels=min_pixels or mcfg.get("min_pixels") or defaults.min_pixels,
            max_pixels=max_pixels or mcfg.get("max_pixels") or defaults.max_pixels)
        adapter = modalities.get(config.modality, min_pixels=config.min_pixels,
                                 max_pixels=config.max_pixels)
        ctx.policy = Policy.load(config, adapter, pick_device(device))
    return ctx


def build_demo(ctx: DemoContext) -> Any:
    """The Blocks app: Vision QA, Audio QA, Image translation, Robustness, Training monitor."""
    import gradio as gr

    model = f"model `{ctx.model_path}`" if ctx.policy is not None else "no model loaded"
    run = f"run `{ctx.run_dir}`" if ctx.run_dir else "no run dir"
    with gr.Blocks(title="mmrlvr demo") as demo:
        gr.Markdown(f"## mmrlvr demo\n{model} · {run}")
        with gr.Tabs(selected="vision" if ctx.policy is not None else "monitor"):
            with gr.Tab("Vision QA", id="vision"):
                vision_tab.build(ctx)
            with gr.Tab("Audio QA", id="audio"):
                audio_tab.build(ctx)
            with gr.Tab("Image translation", id="translation"):
                translation_tab.build(ctx)
            with gr.Tab("Robustness", id="robustness"):
                robustness_tab.build(ctx)
            with gr.Tab("Training monitor", id="monitor"):
                monitor_tab.build(ctx.run_dir)
    return demo


def launch(demo: Any, host: str = "127.0.0.1", port: int | None = 7860,
           block: bool = True) -> str:
    """Serve `demo`; returns its URL (at once when `block` is False, e.g. in tests)."""
    demo.queue(default_concurrency_limit=1)
    _, url, _ = demo.launch(server_name=host, server_port=port, prevent_thread_lock=not block,
                            max_file_size=MAX_FILE_SIZE, ssr_mode=False, quiet=not block,
                            footer_links=["api"])
    return url


def serve(model: str | None = None, run: str | None = None, host: str = "127.0.0.1",
          port: int = 7860, device: str = "auto", min_pixels: int | None = None,
          max_pixels: int | None = None, modality: str | None = None) -> int:
    ctx = load_context(model, run, device, min_pixels, max_pixels, modality)
    try:
        launch(build_demo(ctx), host=host, port=port, block=True)
    except OSError as err:  # the port is taken, or the host is not this machine's
        print(f"mmrlvr demo: error: cannot serve on {host}:{port}: {err} (try another --port)",
              file=sys.stderr)
        return 2
    return 0
