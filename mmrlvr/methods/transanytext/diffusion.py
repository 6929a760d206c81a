"""TransAnyText's diffusion stage: erase the source text and refine the drawn text with a local
diffusers inpainting pipeline, or erase with OpenCV (the CPU fallback, no refinement).

    erase   mask M_e = the source text's ink (`mmrlvr.patches.render.text_mask`); the pipeline
            fills it from pure noise (strength 1) under the prompt "clean background, no text"
    render  the patch drawn on the erased background (the deterministic PIL renderer)
    refine  mask M_r = the drawn glyphs (the text layer's alpha > 0), grown by `grow` px; the same
            pipeline re-noises that region to `refine_strength` and denoises it, so the glyphs
            take on the background's texture and light while keeping their shapes

Both passes run on a crop around their mask (plus `context` px), scaled so the crop's longer side
is `size` px (512: Stable Diffusion's native scale; a 30 px banner line would be 4 latent pixels
at its own size), and the output is pasted back through the mask, so every pixel outside M_e
(erase) or M_r (refine) stays exactly the input's. Refinement is *our reading* of the paper's
"diffusion refinement" (an inpainting pass at low strength over the rendered text); the paper's
model, prompt and strength are not known to us, and 0.3 is ours.

Which eraser runs (`--eraser`): `auto` (the default) takes diffusers when a CUDA device is present
and a pipeline dir is given (`--inpaint-model`), else OpenCV, and says why (OUT.json); `opencv`
and `diffusers` force one. `--refine auto` refines exactly when the diffusers eraser runs.
diffusers is imported only when a pipeline is loaded.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

ERASERS = ("auto", "opencv", "diffusers")
REFINE = ("auto", "on", "off")
ERASE_PROMPT = "clean background, no text"
REFINE_PROMPT = "text printed on the background, sharp, natural lighting"


@dataclass(frozen=True)
class StageChoice:
    """What the stage runs: the eraser, whether it refines, and why (written to OUT.json)."""

    eraser: str
    refine: bool
    why: str


def choose(eraser: str = "auto", refine: str = "auto", model_dir: str | Path | None = None,
           cuda: bool | None = None) -> StageChoice:
    """Resolve `--eraser` and `--refine` (module docstring); `cuda` None: ask torch."""
    if eraser not in ERASERS:
        raise ValueError(f"eraser must be one of {ERASERS}, got {eraser!r}")
    if refine not in REFINE:
        raise ValueError(f"refine must be one of {REFINE}, got {refine!r}")
    if eraser == "diffusers" and not model_dir:
        raise ValueError("eraser 'diffusers' needs a local diffusers pipeline dir (--inpaint-model DIR)")
    if eraser == "auto":
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        eraser, why = (("diffusers", "auto: CUDA device and a pipeline dir") if cuda and model_dir
                       else ("opencv", "auto: no CUDA device" if not cuda
                             else "auto: no diffusers pipeline dir (--inpaint-model)"))
    else:
        why = f"asked for {eraser}"
    if refine == "on" and eraser != "diffusers":
        raise ValueError(f"refine 'on' needs the diffusers eraser (it runs the same pipeline); "
                         f"the eraser is {eraser} ({why})")
    return StageChoice(eraser, refine == "on" or (refine == "auto" and eraser == "diffusers"), why)


def load_inpainting_pipeline(model_dir: str | Path, device: str = "cpu") -> Any:
    """A diffusers inpainting pipeline from a local dir (fp16 on CUDA), with errors naming the dir."""
    path = Path(model_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"diffusion stage: pipeline dir {path} does not exist "
                                "(give a local diffusers inpainting pipeline, saved by save_pretrained)")
    if not (path / "model_index.json").is_file():
        raise ValueError(f"diffusion stage: {path} is not a diffusers pipeline dir (it has no "
                         "model_index.json); save one with pipeline.save_pretrained(DIR)")
    try:
        import torch
        from diffusers import AutoPipelineForInpainting
    except ImportError as err:
        raise ImportError("the diffusion stage needs `pip install diffusers`") from err
    dtype = torch.float16 if str(device).startswith("cuda") else torch.float32
    try:
        pipe = AutoPipelineForInpainting.from_pretrained(str(path), local_files_only=True,
                                                         dtype=dtype)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"diffusion stage: could not load the inpainting pipeline in {path}: "
                         f"{type(err).__name__}: {err}") from err
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def crop_box(mask: np.ndarray, context: int) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1) around the mask's pixels grown by `context` px, inside the image; None
    when the mask is empty."""
    ys, xs = np.nonzero(mask)
    if not len(xs):
        return None
    H, W = mask.shape
    return (max(int(xs.min()) - context, 0), max(int(ys.min()) - context, 0),
            min(int(xs.max()) + 1 + context, W), min(int(ys.max()) + 1 + context, H))


def work_size(width: int, height: int, size: int) -> tuple[int, int]:
    """The crop's size scaled so its longer side is `size`, each side a multiple of 8 (the VAE's)."""
    scale = size / max(width, height)
    return tuple(max(8, int(round(s * scale / 8)) * 8) for s in (width, height))


def glyph_mask(layer: Image.Image, grow: int = 2) -> np.ndarray:
    """uint8 mask [H, W] (255 = refine) of the text layer's drawn pixels, grown by `grow` px."""
    import cv2

    mask = (np.asarray(layer.convert("RGBA"))[:, :, 3] > 0).astype(np.uint8) * 255
    return cv2.dilate(mask, np.ones((2 * grow + 1,) * 2, np.uint8)) if grow else mask


class DiffusionStage:
    """Erase (`__call__`, so `mmrlvr.patches.render.erase` can take it as its inpainter) and
    refine with one local inpainting pipeline (module docstring)."""

    def __init__(self, model_dir: str | Path, *, device: str = "cpu", steps: int = 20,
                 size: int = 512, context: int = 16, refine_strength: float = 0.3, grow: int = 2,
                 erase_prompt: str = ERASE_PROMPT, refine_prompt: str = REFINE_PROMPT,
                 seed: int = 0):
        if not 0.0 < refine_strength <= 1.0:
            raise ValueError(f"refine_strength must be in (0, 1], got {refine_strength}")
        if int(steps * refine_strength) < 1:        # diffusers runs int(steps·strength) steps
            raise ValueError(f"steps {steps} × refine_strength {refine_strength} leaves no "
                             "denoising step for refinement; raise either")
        if size < 8:
            raise ValueError(f"size must be >= 8 px, got {size}")
        self.pipe = load_inpainting_pipeline(model_dir, device)
        self.model_dir, self.device, self.steps, self.size = str(model_dir), device, steps, size
        self.context, self.refine_strength, self.grow, self.seed = context, refine_strength, grow, seed
        self.erase_prompt, self.refine_prompt = erase_prompt, refine_prompt
        self.seconds = {"erase": 0.0, "refine": 0.0}
        """Wall time spent in each pass, over this stage's lifetime."""

    def _inpaint(self, image: Image.Image, mask: np.ndarray, strength: float, prompt: str
                 ) -> Image.Image:
        """The pipeline over the mask's crop at `strength`, pasted back through the mask."""
        import torch

        rgb = image.convert("RGB")
        box = crop_box(mask > 0, self.context)
        if box is None:
            return rgb.copy()
        crop = rgb.crop(box)
        keep = Image.fromarray((mask[box[1]:box[3], box[0]:box[2]] > 0).astype(np.uint8) * 255)
        w, h = work_size(*crop.size, self.size)
        gen = torch.Generator(device="cpu").manual_seed(self.seed)      # same noise on any device
        out = self.pipe(prompt=prompt, image=crop.resize((w, h), Image.LANCZOS),
                        mask_image=keep.resize((w, h), Image.NEAREST), height=h, width=w,
                        strength=strength, num_inference_steps=self.steps, generator=gen).images[0]
        filled = Image.composite(out.convert("RGB").resize(crop.size, Image.LANCZOS), crop, keep)
        result = rgb.copy()
        result.paste(filled, box[:2])
        return result

    def __call__(self, image: Image.Image, mask: np.ndarray) -> Image.Image:
        """Erase: the masked pixels inpainted from noise (strength 1)."""
        t0 = time.perf_counter()
        out = self._inpaint(image, mask, 1.0, self.erase_prompt)
        self.seconds["erase"] += time.perf_counter() - t0
        return out

    def refine(self, image: Image.Image, layer: Image.Image) -> Image.Image:
        """Refine: the drawn glyphs of `layer` (RGBA, the image's size) re-noised to
        `refine_strength` and denoised; nothing outside them changes."""
        t0 = time.perf_counter()
        out = self._inpaint(image, glyph_mask(layer, self.grow), self.refine_strength,
                            self.refine_prompt)
        self.seconds["refine"] += time.perf_counter() - t0
        return out
