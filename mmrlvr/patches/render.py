"""Rendering HTML patches and erasing source text.

Two renderers follow the same layout rules (`mmrlvr.patches.schema`): one line per box, the line box as
tall as the box (CSS `line-height: h`, glyphs centred by the font's ascent and descent),
`text-align` within the box width, and a line wider than its box start-aligned and overflowing
(CSS Text 3). Fonts are the installed files `fc-match` names for the patch's family and weight,
so both renderers draw the same outlines.

- `render_patch` (PIL, in process, deterministic): what rewards and `mmrlvr translate` use.
- `BrowserRenderer` (Playwright driving Chromium): the reference; it renders `to_document`, a
  real HTML page with the same boxes. `tests/test_render.py` measures how well the two agree.

Text erasure: `text_mask` marks the source text's pixels (its "ink" inside each box, or the
whole box), `erase` fills them with OpenCV inpainting (Telea) or a diffusers inpainting pipeline
loaded from a local directory (`DiffusersInpainter`).
"""
from __future__ import annotations

import base64
import functools
import io
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mmrlvr.patches.schema import Patch, TextBox, box_style

CHROMIUM_PATH = os.environ.get("MMRLVR_CHROMIUM", "/usr/bin/chromium")
"""The Chromium binary Playwright drives (Debian's package; set MMRLVR_CHROMIUM to override)."""
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--font-render-hinting=none")

_FALLBACK_FILES = {
    ("DejaVu Sans", False): "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    ("DejaVu Sans", True): "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
    ("DejaVu Serif", False): "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
    ("DejaVu Serif", True): "/usr/share/fonts/truetype/dejavu/DejaVuSerif-Bold.ttf",
    ("DejaVu Sans Mono", False): "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
    ("DejaVu Sans Mono", True): "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf",
}


class RenderError(RuntimeError):
    """A patch that cannot be drawn (a missing font file, an impossible size)."""


@functools.lru_cache(maxsize=None)
def font_file(family: str, bold: bool) -> str:
    """The font file for `family` at regular or bold weight, as fontconfig (and Chromium) picks it."""
    if shutil.which("fc-match"):
        out = subprocess.run(["fc-match", "-f", "%{file}|%{family}", f"{family}:{'bold' if bold else 'regular'}"],
                             capture_output=True, text=True, check=False).stdout
        path, _, found = out.partition("|")
        if path and family.lower() in found.lower() and Path(path).is_file():
            return path
    path = _FALLBACK_FILES.get((family, bold))
    if path and Path(path).is_file():
        return path
    raise RenderError(f"font {family!r} ({'bold' if bold else 'regular'}) is not installed; "
                      "install it (Debian: fonts-dejavu-core, fonts-liberation) or use DejaVu Sans")


@functools.lru_cache(maxsize=512)
def load_font(family: str, bold: bool, size: float) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(font_file(family, bold), size=max(size, 1.0))


def text_width(box: TextBox, size: float | None = None) -> float:
    """Advance width in px of the box's text at `size` (default the box's)."""
    font = load_font(box.font, box.bold, size or box.size)
    return font.getlength(box.text, direction=box.direction)


def line_origin(box: TextBox) -> tuple[float, float]:
    """Left end of the baseline (x, y) under the shared layout rules."""
    font = load_font(box.font, box.bold, box.size)
    ascent, descent = font.getmetrics()
    width = text_width(box)
    start_left = box.direction == "ltr"
    if width > box.w:                           # overflow: start-aligned (CSS Text 3)
        x = box.x if start_left else box.x + box.w - width
    elif box.align == "left":
        x = box.x
    elif box.align == "right":
        x = box.x + box.w - width
    else:
        x = box.x + (box.w - width) / 2
    baseline = box.y + (box.h - (ascent + descent)) / 2 + ascent
    return x, baseline


MAX_SIZE_RATIO = 4
"""A font size above this many times the canvas's longer side is refused (a broken patch: PIL
would try to allocate a glyph bitmap of gigabytes)."""


def render_layer(patch: Patch, size: tuple[int, int]) -> Image.Image:
    """The patch's text alone on a transparent RGBA canvas of `size` (boxes scaled to it)."""
    patch = patch.scaled(*size)
    layer = Image.new("RGBA", size, (0, 0, 0, 0))
    for i, box in enumerate(patch.boxes, start=1):
        if box.size > MAX_SIZE_RATIO * max(size):
            raise RenderError(f"box {i}: font-size {box.size:.0f}px is far larger than the "
                              f"{size[0]}x{size[1]} canvas (limit {MAX_SIZE_RATIO}x its longer side)")
        mask = Image.new("L", size, 0)
        x, baseline = line_origin(box)
        ImageDraw.Draw(mask).text((x, baseline), box.text, fill=255, anchor="ls",
                                  font=load_font(box.font, box.bold, box.size),
                                  direction=box.direction)
        ink = Image.new("RGBA", size, (*box.color, 0))
        ink.putalpha(mask)
        layer.alpha_composite(ink)
    return layer


def render_patch(patch: Patch, background: Image.Image) -> Image.Image:
    """Draw the patch on `background` (RGB out); the same inputs give the same pixels."""
    base = background.convert("RGBA")
    base.alpha_composite(render_layer(patch, base.size))
    return base.convert("RGB")


# ----------------------------------------------------------------------------- browser

def _data_uri(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def to_document(patch: Patch, background: Image.Image) -> str:
    """A standalone HTML page: the background image with the patch's boxes over it."""
    import html as _html

    w, h = background.size
    patch = patch.scaled(w, h)
    boxes = "".join(
        f'<div style="{box_style(b)};line-height:{b.h}px">{_html.escape(b.text, quote=False)}</div>'
        for b in patch.boxes)
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><style>"
            "html,body{margin:0;padding:0;background:#fff}"
            f"#canvas{{position:relative;width:{w}px;height:{h}px;overflow:hidden;"
            f"background:url({_data_uri(background)}) no-repeat}}"
            "#canvas>div{position:absolute;white-space:pre;margin:0;padding:0;border:0;"
            "font-style:normal;letter-spacing:0;font-kerning:normal}"
            f"</style></head><body><div id=\"canvas\">{boxes}</div></body></html>")


def chromium_status() -> tuple[bool, str]:
    """(usable, reason): whether Playwright and the Chromium binary are both present."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return False, "the playwright package is not installed (pip install playwright)"
    if not Path(CHROMIUM_PATH).is_file():
        return False, f"no Chromium at {CHROMIUM_PATH} (apt install chromium, or set MMRLVR_CHROMIUM)"
    return True, ""


class BrowserRenderer:
    """The reference renderer: Chromium draws `to_document` and we screenshot the canvas.

        with BrowserRenderer() as br:
            image = br.render(patch, background)
    """

    def __init__(self, executable: str = CHROMIUM_PATH):
        self.executable = executable
        self._pw = self._browser = None

    def __enter__(self) -> "BrowserRenderer":
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self._browser = self._pw.chromium.launch(executable_path=self.executable,
                                                 args=list(CHROMIUM_ARGS))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._pw is not None:
            self._pw.stop()

    def render(self, patch: Patch, background: Image.Image) -> Image.Image:
        w, h = background.size
        page = self._browser.new_page(viewport={"width": w, "height": h}, device_scale_factor=1)
        try:
            page.set_content(to_document(patch, background))
            page.evaluate("document.fonts.ready.then(() => true)")
            png = page.locator("#canvas").screenshot(animations="disabled")
        finally:
            page.close()
        return Image.open(io.BytesIO(png)).convert("RGB")


# ----------------------------------------------------------------------------- erasure

def text_mask(image: Image.Image, boxes: list[TextBox], *, mode: str = "ink", margin: int = 2,
              threshold: int = 48, dilate: int = 2) -> np.ndarray:
    """uint8 mask [H, W] (255 = erase) over the text of `boxes` (in the image's pixel space).

    `ink`: inside each box (grown by `margin` px), pixels whose colour differs from the box
    border's median by more than `threshold` on some channel, grown by `dilate` px to take the
    anti-aliased edges; a box with no such pixels is masked whole. `box`: every box whole.
    """
    import cv2

    if mode not in ("ink", "box"):
        raise ValueError(f"text_mask mode must be 'ink' or 'box', got {mode!r}")
    rgb = np.asarray(image.convert("RGB")).astype(np.int16)               # [H, W, 3]
    H, W = rgb.shape[:2]
    mask = np.zeros((H, W), np.uint8)
    for b in boxes:
        x0, y0 = max(int(np.floor(b.x)) - margin, 0), max(int(np.floor(b.y)) - margin, 0)
        x1, y1 = min(int(np.ceil(b.x + b.w)) + margin, W), min(int(np.ceil(b.y + b.h)) + margin, H)
        if x1 <= x0 or y1 <= y0:
            continue
        region = rgb[y0:y1, x0:x1]
        if mode == "box":
            mask[y0:y1, x0:x1] = 255
            continue
        ring = np.concatenate([region[0], region[-1], region[:, 0], region[:, -1]])   # [n, 3]
        bg = np.median(ring, axis=0)
        ink = (np.abs(region - bg).max(axis=-1) > threshold)
        if ink.any():
            mask[y0:y1, x0:x1][ink] = 255
        else:
            mask[y0:y1, x0:x1] = 255
    if dilate and mode == "ink":
        mask = cv2.dilate(mask, np.ones((2 * dilate + 1, 2 * dilate + 1), np.uint8))
    return mask


def erase(image: Image.Image, mask: np.ndarray, *, method: str = "opencv", radius: int = 3,
          inpainter: "DiffusersInpainter | None" = None) -> Image.Image:
    """The image with the masked pixels filled in: OpenCV Telea (default) or `inpainter`."""
    if method == "opencv":
        import cv2

        bgr = np.asarray(image.convert("RGB"))[:, :, ::-1].copy()
        out = cv2.inpaint(bgr, (mask > 0).astype(np.uint8) * 255, radius, cv2.INPAINT_TELEA)
        return Image.fromarray(out[:, :, ::-1].copy())
    if method == "diffusers":
        if inpainter is None:
            raise ValueError("erase(method='diffusers') needs an `inpainter` (DiffusersInpainter(dir))")
        return inpainter(image, mask)
    raise ValueError(f"erase method must be 'opencv' or 'diffusers', got {method!r}")


class DiffusersInpainter:
    """A diffusers inpainting pipeline from a local directory (`AutoPipelineForInpainting`).

    Only the masked pixels change: the pipeline's output is pasted back through the mask, so
    the rest of the image stays exact whatever the pipeline's VAE does to it.
    """

    def __init__(self, model_dir: str | Path, *, steps: int = 20, device: str = "cpu",
                 prompt: str = "clean background, no text", seed: int = 0):
        try:
            from diffusers import AutoPipelineForInpainting
        except ImportError as err:
            raise ImportError("the diffusers inpainting option needs `pip install diffusers`") from err
        if not Path(model_dir).is_dir():
            raise FileNotFoundError(f"inpainting model dir not found: {model_dir}")
        self.pipe = AutoPipelineForInpainting.from_pretrained(str(model_dir), local_files_only=True)
        self.pipe.to(device)
        self.pipe.set_progress_bar_config(disable=True)
        self.steps, self.prompt, self.seed, self.device = steps, prompt, seed, device

    def __call__(self, image: Image.Image, mask: np.ndarray) -> Image.Image:
        import torch

        rgb = image.convert("RGB")
        mask_img = Image.fromarray((mask > 0).astype(np.uint8) * 255)
        # the VAE needs sides divisible by 8: run at the nearest such size, then resize back
        w8, h8 = (max(8, round(s / 8) * 8) for s in rgb.size)
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        out = self.pipe(prompt=self.prompt, image=rgb.resize((w8, h8)),
                        mask_image=mask_img.resize((w8, h8)), height=h8, width=w8,
                        num_inference_steps=self.steps, generator=gen).images[0]
        out = out.resize(rgb.size)
        return Image.composite(out, rgb, mask_img)
