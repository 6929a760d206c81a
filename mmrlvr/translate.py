"""`mmrlvr translate`: one image in, its text translated in place out (TransAnyText).

    mmrlvr translate --model DIR --image IN.png --lang de --out OUT.png

1. the model (image_translation adapter) writes an HTML patch for the target language (greedy);
2. the source text is erased over the text pixels inside the boxes — of `--source-patch` when
   given, else of the predicted patch, whose boxes keep the source layout — by a local diffusers
   inpainting pipeline or by OpenCV (`--eraser auto`: diffusers on a CUDA machine given
   `--inpaint-model`, else OpenCV; `mmrlvr/methods/transanytext/diffusion.py`);
3. the patch is drawn on the erased background with the deterministic PIL renderer;
4. with the diffusers eraser (`--refine auto`), the same pipeline refines the drawn glyphs at low
   strength; nothing outside them changes.

Writes OUT.png (final), OUT.erased.png, OUT.patch.png (the text layer, transparent),
OUT.patch.html and OUT.json (raw completion, parse error if any, the diffusion stage's choice,
timings); with refinement also OUT.rendered.png (before it). A patch that does not parse still
leaves the five files: the erased and final images are then the input unchanged.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

from mmrlvr.patches.schema import Patch, PatchError, parse, to_html
from mmrlvr.patches.render import erase, render_layer, text_mask


def compose(image: Image.Image, patch: Patch, *, erase_boxes: Patch | None = None,
            method: str = "opencv",
            inpainter: Callable[[Image.Image, np.ndarray], Image.Image] | None = None,
            mask_mode: str = "ink") -> tuple[Image.Image, Image.Image, Image.Image]:
    """(erased background, text layer RGBA, final image) for `patch` over `image`."""
    image = image.convert("RGB")
    size = image.size
    source = (erase_boxes or patch).scaled(*size)
    mask = text_mask(image, source.boxes, mode=mask_mode)
    erased = erase(image, mask, method=method, inpainter=inpainter) if mask.any() else image.copy()
    layer = render_layer(patch, size)
    final = erased.convert("RGBA")
    final.alpha_composite(layer)
    return erased, layer, final.convert("RGB")


def output_paths(out: str | Path) -> dict[str, Path]:
    out = Path(out)
    stem = out.with_suffix("")
    return {"final": out, "erased": Path(f"{stem}.erased.png"), "layer": Path(f"{stem}.patch.png"),
            "html": Path(f"{stem}.patch.html"), "json": Path(f"{stem}.json"),
            "rendered": Path(f"{stem}.rendered.png")}



def patch_from_completion(text: str, size: tuple[int, int]) -> tuple[Patch, str | None]:
    """The patch a completion holds, sized to the picture when it names no size, and the reason
    it holds none (an empty patch is returned then, so callers can still compose)."""
    from mmrlvr.methods.transanytext.reward import extract_patch

    raw = extract_patch(text)
    try:
        if raw is None:
            raise PatchError("the completion holds no patch (empty, or an unclosed <answer>)")
        patch, error = parse(raw), None
    except PatchError as err:
        patch, error = Patch([], *size), str(err)
    if patch.width is None or patch.height is None:
        patch = Patch(patch.boxes, *size)
    return patch, error

def diffusion_stage(eraser: str, refine: str, inpaint_model: str | None, device: Any,
                    inpaint_steps: int, refine_strength: float) -> tuple[Any, Any]:
    """The stage's choice and, with the diffusers eraser, the loaded stage (None for OpenCV)."""
    from mmrlvr.methods.transanytext.diffusion import DiffusionStage, choose

    choice = choose(eraser, refine, inpaint_model, cuda=device.type == "cuda")
    if choice.eraser == "opencv":
        return choice, None
    return choice, DiffusionStage(inpaint_model, device=str(device), steps=inpaint_steps,
                                  refine_strength=refine_strength)


def translate(model: str, image: str | Path, lang: str, out: str | Path, *,
              source_lang: str | None = None, source_patch: str | Path | None = None,
              eraser: str = "auto", refine: str = "auto", inpaint_model: str | None = None,
              inpaint_steps: int = 20, refine_strength: float = 0.3,
              max_new_tokens: int = 512, device: str = "auto", min_pixels: int = 56 * 56,
              max_pixels: int = 448 * 448) -> dict[str, Any]:
    """Run the pipeline above; returns what OUT.json holds."""
    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.train.policy import Policy, pick_device
    from mmrlvr.rollout import make_engine
    from mmrlvr.rollout.base import SamplingParams
    from modalities.image_translation import make_example

    t0 = time.perf_counter()
    dev = pick_device(device)
    choice, stage = diffusion_stage(eraser, refine, inpaint_model, dev, inpaint_steps,
                                    refine_strength)                 # a bad pipeline dir fails first
    paths = output_paths(out)
    paths["final"].parent.mkdir(parents=True, exist_ok=True)
    with Image.open(image) as fh:
        picture = fh.convert("RGB")
    adapter = modalities.get("image_translation", min_pixels=min_pixels, max_pixels=max_pixels)
    policy = Policy.load(ModelConfig(path=model, modality="image_translation"), adapter, dev)
    example = make_example(str(image), lang, source=source_lang, id=Path(image).stem)
    batch = adapter.encode([example], policy.processor)
    rollout = make_engine("hf", policy).generate(
        batch, SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
    completion = rollout.texts[0]
    t1 = time.perf_counter()

    patch, error = patch_from_completion(completion, picture.size)
    known = parse(Path(source_patch).read_text()) if source_patch else None
    if known is not None and (known.width is None or known.height is None):
        known = Patch(known.boxes, *picture.size)
    erased, layer, final = compose(picture, patch, erase_boxes=known, method=choice.eraser,
                                   inpainter=stage)
    refined = choice.refine and bool(patch.boxes)       # nothing drawn: nothing to refine
    if refined:
        final.save(paths["rendered"])
        final = stage.refine(final, layer)
    erased.save(paths["erased"])
    layer.save(paths["layer"])
    final.save(paths["final"])
    paths["html"].write_text(to_html(patch, indent=True) + "\n", encoding="utf-8")
    result = {"image": str(image), "lang": lang, "model": model, "completion": completion,
              "parse_error": error, "boxes": len(patch.boxes),
              "diffusion": {"eraser": choice.eraser, "refine": choice.refine, "why": choice.why},
              "files": {k: str(v) for k, v in paths.items() if k != "rendered" or refined},
              "seconds": {"generate": t1 - t0, **({"erase": stage.seconds["erase"],
                          "refine": stage.seconds["refine"]} if stage else {}),
                          "total": time.perf_counter() - t0}}
    paths["json"].write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return result


def cmd_translate(args) -> int:
    """`mmrlvr translate`: one image in, the patch's images and HTML out (paths printed)."""
    import sys

    try:
        result = translate(args.model, args.image, args.lang, args.out,
                           source_lang=args.source_lang, source_patch=args.source_patch,
                           eraser=args.eraser, refine=args.refine, inpaint_model=args.inpaint_model,
                           inpaint_steps=args.inpaint_steps, refine_strength=args.refine_strength,
                           max_new_tokens=args.max_new_tokens, device=args.device,
                           min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    except (PatchError, ImportError, FileNotFoundError, ValueError) as err:
        print(f"mmrlvr translate: error: {err}", file=sys.stderr)
        return 2
    if result["parse_error"]:
        print(f"warning: the model's patch did not parse ({result['parse_error']}); "
              "the images hold the input unchanged", file=sys.stderr)
    print(json.dumps(result["files"], indent=2))
    return 0
