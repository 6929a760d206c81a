"""The built-in tools: `zoom` on the example's image and `clip` on its audio.

Both read the example's own media at the resolution stored on disk, so a zoom shows detail the
prompt's downscaled image lost (the family resizes the crop to its pixel bounds like any image:
a quarter of a 448 px image shown at 112 px is magnified 2x), and a clip lets the policy listen
to a stretch of the input again, alone.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

CLIP_RATE = 16000
"""The rate `clip` reads audio at (the Whisper feature extractors'); the adapter resamples."""


def zoom(example: Any, x: float, y: float, w: float, h: float, image: int = 0) -> Image.Image:
    """The box (x, y, w, h) in pixels of the example's image `image` as stored (top-left corner
    x, y; width w, height h), clamped to the image; a box outside it is an error."""
    if not example.images:
        raise ValueError(f"sample {example.id} has no image to zoom into")
    source = example.images[int(image)]
    if isinstance(source, Image.Image):
        pil = source
    else:
        with Image.open(source) as fh:
            fh.load()
            pil = fh.copy()
    x0, y0 = max(0, int(round(float(x)))), max(0, int(round(float(y))))
    x1 = min(pil.width, int(round(float(x) + float(w))))
    y1 = min(pil.height, int(round(float(y) + float(h))))
    if x1 - x0 < 1 or y1 - y0 < 1:
        raise ValueError(f"box x={x} y={y} w={w} h={h} holds no pixel of the "
                         f"{pil.width}x{pil.height} image")
    return pil.convert("RGB").crop((x0, y0, x1, y1))


def clip(example: Any, t0: float, t1: float, audio: int = 0) -> tuple[np.ndarray, int]:
    """Seconds t0..t1 of the example's audio `audio` (clamped to the clip), at 16 kHz."""
    from mmrlvr.data.media import read_audio

    if not example.audios:
        raise ValueError(f"sample {example.id} has no audio to clip")
    wave = read_audio(example.audios[int(audio)], CLIP_RATE, sample=example.id)
    a = max(0, int(float(t0) * CLIP_RATE))
    b = min(len(wave), int(float(t1) * CLIP_RATE))
    if b - a < CLIP_RATE // 100:
        raise ValueError(f"t0={t0} t1={t1} s leaves under 10 ms of the "
                         f"{len(wave) / CLIP_RATE:.2f} s clip")
    return wave[a:b].copy(), CLIP_RATE
