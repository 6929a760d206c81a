"""Vision pretraining: teach a tiny model's vision tower to read before the language model sees it.

A real VLM's vision tower arrives pretrained (Qwen2.5-VL's ViT has seen OCR data); a tiny
random-weight one (`mmrlvr tiny`) does not, and trained through the language model alone it
does not learn to read: on 112x56 banners, 3,000 SFT steps over 20,000 images left a headline
reader at chance (0.10 on 12 phrases) although the same ViT, trained directly on the phrase,
reads it perfectly in 1,000 steps (45 s on one core). `pretrain_vision` is that direct step:
one linear head per slot over the vision tower's merged tokens (flattened, so every image needs
the same token grid), cross-entropy on each slot's label, Adam. Only the tower is kept; the
heads are thrown away and the language model is untouched.

Labels come from each row's `meta.vision_labels` ({slot: label}; `mmrlvr data banners` writes
the source text of each role). A slot a row lacks is the class "" (absent). A held-out split
reports accuracy per slot before and after.
"""
from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mmrlvr.data import DataError, Example, load_dataset

ABSENT = ""
"""The class of a slot the row does not have."""


def vision_labels(ex: Example) -> dict[str, str]:
    labels = (ex.meta or {}).get("vision_labels")
    if not isinstance(labels, dict) or not labels:
        raise DataError(f"sample {ex.id}: vision pretraining needs meta.vision_labels "
                        f"({{slot: label}}, e.g. from `mmrlvr data banners`)")
    if len(ex.images) + len(ex.videos) != 1:
        raise DataError(f"sample {ex.id}: vision pretraining needs exactly one image or one "
                        f"video, got {len(ex.images)} image(s) and {len(ex.videos)} video(s)")
    return {str(k): str(v) for k, v in labels.items()}


def label_space(rows: list[Example]) -> dict[str, list[str]]:
    """Per slot, the sorted labels seen in `rows`, with ABSENT first."""
    seen: dict[str, set[str]] = {}
    for ex in rows:
        for slot, label in vision_labels(ex).items():
            seen.setdefault(slot, set()).add(label)
    return {slot: [ABSENT] + sorted(v - {ABSENT}) for slot, v in sorted(seen.items())}


def targets(rows: list[Example], space: dict[str, list[str]]) -> torch.Tensor:
    """[N, slots] class indices; a label the space lacks (held-out only) is -1 (never right)."""
    out = torch.full((len(rows), len(space)), -1, dtype=torch.long)
    for i, ex in enumerate(rows):
        labels = vision_labels(ex)
        for j, (slot, classes) in enumerate(space.items()):
            label = labels.get(slot, ABSENT)
            if label in classes:
                out[i, j] = classes.index(label)
    return out


def processor_video_kwargs(processor: Any) -> dict[str, Any]:
    """Frames come sampled and resized (the adapter's `load_video`): the video processor only
    patches them (its per-frame pixel cap, where it has one, has nothing left to do)."""
    cap = hasattr(processor.video_processor, "cap_pixels_per_frame")
    return {"do_resize": False, "do_sample_frames": False,
            **({"cap_pixels_per_frame": False} if cap else {})}


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    for owner in (model, getattr(model, "model", None)):
        tower = getattr(owner, "visual", None) if owner is not None else None
        if tower is not None:
            return tower
    raise ValueError(f"{type(model).__name__} has no vision tower (`visual`): vision pretraining "
                     f"is for image-text models")


def merged_tokens(out: Any) -> torch.Tensor:
    """The tower's merged tokens [N*T, D], whether it returns them or an output object."""
    return getattr(out, "pooler_output", out)


class Reader(torch.nn.Module):
    """The vision tower plus one linear head per slot over its flattened merged tokens."""

    def __init__(self, tower: torch.nn.Module, tokens: int, width: int, sizes: list[int]):
        super().__init__()
        self.tower, self.tokens = tower, tokens
        self.heads = torch.nn.ModuleList(torch.nn.Linear(tokens * width, n) for n in sizes)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        flat = merged_tokens(self.tower(pixel_values, grid_thw=grid_thw)).reshape(grid_thw.shape[0], -1)
        return [head(flat) for head in self.heads]


def _batch_pixels(batch: list[Example], adapter: Any, processor: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's pixel values and patch grids, loaded as training loads them; one grid for all."""
    if batch[0].videos:        # clips sampled and resized as training does; the tower takes them as is
        clips = [adapter.load_video(ex.videos[0], 0, ex, processor) for ex in batch]
        out = processor.video_processor(videos=[c.frames for c in clips], return_tensors="pt",
                                        **processor_video_kwargs(processor))
        pv, grid = out["pixel_values_videos"], out["video_grid_thw"]
    else:
        images = [adapter.load_image(ex.images[0], ex, processor) for ex in batch]
        out = processor.image_processor(images=images, return_tensors="pt")
        pv, grid = out["pixel_values"], out["image_grid_thw"]
    if not bool((grid == grid[0]).all()):
        bad = next(ex.id for ex, g in zip(batch, grid) if not torch.equal(g, grid[0]))
        raise DataError(f"sample {bad}: its medium makes a {tuple(grid[0].tolist())} patch grid "
                        f"but others make another; vision pretraining needs one image size "
                        f"(and one frame count)")
    return pv, grid


def _held_out_accuracy(reader: Reader, held: list[Example], y_held: torch.Tensor | None,
                      space: dict[str, list[str]], pixels) -> dict[str, float]:
    """Per slot, the share of `held` the reader gets right (empty without a held-out split)."""
    if not held:
        return {}
    reader.eval()
    right = torch.zeros(len(space))
    with torch.no_grad():
        for start in range(0, len(held), 64):
            logits = reader(*pixels(held[start:start + 64]))
            y = y_held[start:start + 64]
            right += torch.stack([(lg.argmax(-1) == y[:, j]).float().sum()
                                  for j, lg in enumerate(logits)])
    reader.train()
    return {slot: float(r) / len(held) for slot, r in zip(space, right)}


def _train_reader(reader: Reader, rows: list[Example], y_train: torch.Tensor, pixels, *, steps: int,
                 batch_size: int, lr: float, seed: int, progress: bool) -> float:
    """`steps` Adam steps of mean per-slot cross-entropy on random batches; returns the seconds taken."""
    from tqdm.auto import tqdm

    opt = torch.optim.Adam(reader.parameters(), lr=lr)
    rng = random.Random(f"vision-pretrain-{seed}")
    bar = tqdm(range(1, steps + 1), desc="vision", disable=not progress)
    t0 = time.perf_counter()
    for _ in bar:
        idx = rng.sample(range(len(rows)), min(batch_size, len(rows)))
        logits = reader(*pixels([rows[i] for i in idx]))
        y = y_train[idx]
        loss = sum(F.cross_entropy(lg, y[:, j]) for j, lg in enumerate(logits)) / len(logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
    return time.perf_counter() - t0


def pretrain_vision(model_dir: str | Path, train: str | Path, out_dir: str | Path, *,
                    eval_data: str | Path | None = None, eval_limit: int = 200, steps: int = 1000,
                    batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
                    min_pixels: int = 56 * 56, max_pixels: int = 112 * 112, threads: int = 0,
                    video_fps: float = 2.0, max_frames: int = 16,
                    progress: bool = True) -> dict[str, Any]:
    """Train the vision tower of `model_dir` on `meta.vision_labels`; write the model to `out_dir`."""
    import modalities
    from mmrlvr.train.policy import load_model, load_processor

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rows = load_dataset(train)
    held = load_dataset(eval_data)[:eval_limit] if eval_data else []
    space = label_space(rows)
    y_train, y_held = targets(rows, space), targets(held, space) if held else None
    adapter = modalities.get("vision", min_pixels=min_pixels, max_pixels=max_pixels,
                             video_fps=video_fps, max_frames=max_frames)
    processor = load_processor(str(model_dir))
    model = load_model(str(model_dir), torch.float32)
    tower = vision_tower(model)

    def pixels(batch: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
        return _batch_pixels(batch, adapter, processor)

    pv, grid = pixels(rows[:1])
    with torch.no_grad():
        tokens, width = merged_tokens(tower(pv, grid_thw=grid)).shape
    reader = Reader(tower, tokens, width, [len(c) for c in space.values()])
    summary: dict[str, Any] = {"model": str(model_dir), "train_rows": len(rows), "steps": steps,
                               "slots": {s: len(c) for s, c in space.items()},
                               "accuracy_start": _held_out_accuracy(reader, held, y_held, space, pixels)}
    summary["seconds"] = _train_reader(reader, rows, y_train, pixels, steps=steps, batch_size=batch_size,
                                      lr=lr, seed=seed, progress=progress)
    summary["accuracy_end"] = _held_out_accuracy(reader, held, y_held, space, pixels)
    out = Path(out_dir)
    if out.resolve() != Path(model_dir).resolve():
        shutil.copytree(model_dir, out, dirs_exist_ok=True)        # tokenizer, processor, notes
    model.save_pretrained(out)
    (out / "vision_pretrain.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
