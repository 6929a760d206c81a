"""Image translation: image + target language → erased background, HTML patch, rendered result.

The pipeline of `mmrlvr translate` (`mmrlvr.translate`) on the loaded model: the model (loaded
with the `image_translation` adapter; `mmrlvr demo --modality image_translation`) writes an HTML
patch for the target language (greedy), the source text under the patch's boxes is erased
(OpenCV inpainting) and the patch is drawn on the erased background (`compose`). A completion
that is not a valid patch is shown as it is, with a message, and the image stays unchanged. The
status counts the patch's tokens as they come (`translate_updates`), so a client that leaves
stops the generation within a token.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

from apps.common import (MAX_NAME_CHARS, DemoContext, UserError, check_text, explain, open_image,
                         warn)

LANGUAGES = ["English", "German", "French", "Spanish", "Russian", "Greek", "Chinese", "Japanese"]
MAX_NEW_TOKENS = 512

Result = tuple[Any, str, Any, str]
"""(erased background, HTML patch, rendered result, status markdown)."""


def language_code(language: str) -> str:
    """A language name or code as the code the prompts know (`de` for German), else as given."""
    from modalities.image_translation import LANGUAGES as CODES

    language = language.strip()
    by_name = {name.lower(): code for code, name in CODES.items()}
    return by_name.get(language.lower(), language)


def translate(ctx: DemoContext, image: Any, language: str,
              max_new_tokens: int = MAX_NEW_TOKENS) -> Result:
    """(erased background, HTML patch, rendered result, status): the last of
    `translate_updates`; never raises."""
    for result in translate_updates(ctx, image, language, max_new_tokens):
        pass
    return result


def translate_updates(ctx: DemoContext, image: Any, language: str,
                      max_new_tokens: int = MAX_NEW_TOKENS) -> Iterator[Result]:
    """The handler: a status per generated token, then the result; never raises."""
    try:
        if image is None:
            raise UserError("Upload an image first.")
        picture = open_image(image, "the image")
        language = check_text(language, "the target language", MAX_NAME_CHARS)
        if not language:
            raise UserError("Pick a target language.")
        reason = ctx.unavailable("image_translation", "Image translation")
        if reason:
            yield None, "", None, reason
            return
        yield from _run(ctx, picture, language_code(language), int(max_new_tokens))
    except Exception as err:  # noqa: BLE001 — shown in the status box; the server keeps serving
        message = explain(err)
        if not isinstance(err, UserError):
            warn(message)
        yield None, "", None, message


def _run(ctx: DemoContext, picture: Any, lang: str, max_new_tokens: int) -> Iterator[Result]:
    import time

    from apps.generate import stream_completion
    from mmrlvr.patches.schema import to_html
    from mmrlvr.translate import compose, patch_from_completion
    from modalities.image_translation import language_name, make_example

    policy = ctx.policy
    try:
        resized = policy.adapter.load_image(picture, None, policy.processor)
    except ValueError as err:  # qwen-vl-utils refuses extreme aspect ratios
        raise UserError(f"the image cannot be resized for the model: {err}") from None
    example = make_example(resized, lang, id="demo")
    t0 = time.perf_counter()
    text, n_tokens = "", 0
    with ctx.lock:
        stream = stream_completion(policy, example, sample=False, temperature=1.0,
                                   max_new_tokens=max_new_tokens,
                                   prompting=ctx.prompting(""))
        with closing(stream):
            for text, n_tokens in stream:          # each token an update: a gone client stops it
                yield None, "", None, f"Translating… {n_tokens} tokens"
    seconds = time.perf_counter() - t0
    patch, error = patch_from_completion(text, picture.size)
    erased, _, final = compose(picture, patch)
    size = f"{picture.width}×{picture.height}"
    if resized.size != picture.size:
        size += f" → model sees {resized.width}×{resized.height}"
    done = f"{n_tokens} tokens in {seconds:.1f} s, image {size}"
    if error is not None:
        shown = ("<!-- the model's completion is not a valid HTML patch; it is shown as written "
                 "-->\n" + (text or "(empty completion)"))
        status = (f"⚠ The model's answer is not a valid HTML patch ({error}); the erased and "
                  f"rendered images are the original, unchanged. ({done})")
        yield erased, shown, final, status
        return
    status = (f"✓ done: {len(patch.boxes)} text box{'es' if len(patch.boxes) != 1 else ''} "
              f"translated into {language_name(lang)} ({done})")
    yield erased, to_html(patch, indent=True), final, status


def pick_example(ctx: DemoContext, index: Any) -> list[Any]:
    from modalities.image_translation import language_name

    ex = ctx.info.examples[int(index)]
    lang = language_name(str(ex.meta.get("target_lang", "")))
    return [ex.images[0], lang, f"Example `{ex.id}` loaded: press **Translate**."]


def build(ctx: DemoContext) -> None:
    import gradio as gr

    from apps.panels import example_table

    reason = ctx.unavailable("image_translation", "Image translation")
    ready = reason is None
    if reason:
        gr.Markdown(f"⚠ {reason}", elem_id="translation-unavailable",
                    elem_classes=["unavailable"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=360):
            image = gr.File(label="image with text", file_types=["image"], height=130,
                            elem_id="translation-image", interactive=ready)
            language = gr.Dropdown(LANGUAGES, value="English", label="target language",
                                   allow_custom_value=True, interactive=ready)
            submit = gr.Button("Translate", variant="primary", elem_id="translation-submit",
                               interactive=ready)
            status = gr.Markdown(elem_id="translation-status", elem_classes=["status"])
            with gr.Accordion("generation settings", open=False):
                max_new = gr.Slider(16, 2048, value=MAX_NEW_TOKENS, step=16,
                                    label="max new tokens")
            examples = example_table(ctx, "image_translation", ready)
        with gr.Column(scale=7, min_width=420, visible=ready):
            with gr.Row():
                erased = gr.Image(label="erased background", interactive=False, type="pil",
                                  height=220)
                rendered = gr.Image(label="rendered result", interactive=False, type="pil",
                                    height=220)
            patch = gr.Code(label="HTML patch", language="html")

    def on_translate(image, language, max_new):
        yield from translate_updates(ctx, image, language, max_new)

    submit.click(on_translate, [image, language, max_new], [erased, patch, rendered, status],
                 api_name="translate")
    if examples is not None:
        examples.click(lambda i: pick_example(ctx, i), examples, [image, language, status],
                       api_name="translation_example", show_progress="hidden")
