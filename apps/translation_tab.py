"""Image translation: image + target language → erased background, HTML patch, rendered result.

The tab checks its input, then says why it cannot translate: no model loaded, a model of another
modality, or (for now) that the tab is not yet wired to `mmrlvr translate`'s pipeline.
"""
from __future__ import annotations

from typing import Any

from apps.common import DemoContext, UserError, explain, open_image

LANGUAGES = ["English", "Chinese", "French", "German", "Spanish", "Japanese"]


def translate(ctx: DemoContext, image: Any, language: str) -> tuple[Any, str, str, str]:
    """The handler: (erased background, HTML patch, rendered HTML, status); never raises."""
    try:
        if image is None:
            raise UserError("Upload an image first.")
        open_image(image, "the image")
        if not (language or "").strip():
            raise UserError("Pick a target language.")
        reason = ctx.unavailable("image_translation", "Image translation")
        if reason:
            return None, "", "", reason
        raise UserError("Image translation is not wired to its adapter yet.")
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        return None, "", "", explain(err)


def build(ctx: DemoContext) -> None:
    import gradio as gr

    reason = ctx.unavailable("image_translation", "Image translation")
    if reason:
        gr.Markdown(f"**{reason}**", elem_id="translation-unavailable")
    with gr.Row():
        with gr.Column():
            image = gr.File(label="image with text", file_types=["image"])
            language = gr.Dropdown(LANGUAGES, value="English", label="target language")
            submit = gr.Button("Translate", variant="primary")
        with gr.Column():
            status = gr.Markdown()
            erased = gr.Image(label="erased background", interactive=False)
            patch = gr.Code(label="HTML patch", language="html")
            rendered = gr.HTML(label="rendered result")

    def on_translate(image, language):
        return translate(ctx, image, language)

    submit.click(on_translate, [image, language], [erased, patch, rendered, status],
                 api_name="translate")
