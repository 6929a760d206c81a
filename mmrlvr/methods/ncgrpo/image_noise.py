"""The baseline NC-GRPO argues against: pixel-space noise on part of each group (NoisyRollout-style).

`rollout.branching: {kind: image_noise, fraction: 0.5, sigma: 0.5}`: the last ⌊fraction·G + ½⌋
members of each group (the same rows latent noise uses) sample with Gaussian noise added to
their images' pixel values,

    x <- x + σ·ε,    ε ~ N(0, I),

where x is what the processor gives the model (`pixel_values`: normalised by the processor's
per-channel mean and std, so σ is in units of that std; for the CLIP/Qwen statistics one unit is
≈ 0.27 of the [0, 1] pixel range). Only the prefill carries pixel values, so only it is touched;
the clean members' pixels, the weights and the training forward (which scores every member
against the clean image) are untouched, so the noise shapes exploration only, as latent noise
does. Text-only rows have nothing to displace and stay clean in effect.

How it reaches the pixels: transformers' `generate` encodes each prompt's images once
(`get_image_features`, before it repeats the features for the G members) and hands the
features to the first forward as `mm_encoder_outputs`. Inside the plan's hooks the encoder call
is watched to keep its pixels, and a forward pre-hook on the first forward over all N rows
replaces each noisy row's image features by the encoder's features of its noisy pixels. Noise is
independent per noisy row (one seed per row, drawn once per call from torch's global RNG, so
reproducible from `train.seed`). Families whose generate does not pre-encode images, or that
feed extra per-layer image features (Qwen3-VL's DeepStack), are refused by name.

Our reading of NoisyRollout: its distortion is Gaussian noise on the image, annealed over
training; here σ is fixed (no annealing) and applied after the processor. vLLM is not supported.
"""
from __future__ import annotations

import copy
import functools
import inspect
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from mmrlvr.methods.ncgrpo.probe import top_module


@dataclass(frozen=True)
class ImageNoiseConfig:
    """The `rollout.branching` mapping of `kind: image_noise`."""

    kind: str = "image_noise"
    """`image_noise` (pixel-space noise; the baseline latent noise is compared with)."""
    fraction: float = 0.5
    """Share of each group sampled from noisy images (the last ⌊fraction·G + ½⌋ members)."""
    sigma: float = 0.5
    """Std of the Gaussian noise added to the processor's normalised pixel values."""

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> "ImageNoiseConfig":
        raw = dict(raw)
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise ValueError(f"rollout.branching (image_noise): unknown key(s) {unknown}; known: {names}")
        for key in ("fraction", "sigma"):
            if key in raw:
                try:
                    raw[key] = float(raw[key])
                except (TypeError, ValueError):
                    raise ValueError(f"rollout.branching.{key} must be a number, got {raw[key]!r}") from None
        out = cls(**raw)
        if not 0.0 <= out.fraction <= 1.0:
            raise ValueError(f"rollout.branching.fraction is {out.fraction}; it must lie in [0, 1]")
        if out.sigma < 0:
            raise ValueError(f"rollout.branching.sigma is {out.sigma}; it must be >= 0")
        return out

    def noisy_members(self, group_size: int) -> int:
        return math.floor(self.fraction * group_size + 0.5)


@dataclass
class PixelPlan:
    """Which rows of one generate call see noisy pixels, with their seeds."""

    sigma: float
    group_size: int
    flags: list[bool]      # [N] row is a noisy member
    seeds: list[int]       # [N] noise seed (0 on clean rows)

    @property
    def active(self) -> bool:
        return self.sigma > 0 and any(self.flags)

    def tags(self) -> list[str]:
        return ["noisy" if f else "clean" for f in self.flags]

    def row(self, r: int) -> None:
        return None        # no per-request payload: the vLLM engine is refused at set-up

    def hooks(self, model: nn.Module, row_mask: torch.Tensor):
        return pixel_noise(model, self)

    def noisy(self, r: int, pixels: list[torch.Tensor]) -> list[torch.Tensor]:
        """Row `r`'s images' pixel blocks with its noise (one generator per row, images in order)."""
        gen = torch.Generator().manual_seed(self.seeds[r])
        return [(x.float() + self.sigma * torch.randn(x.shape, generator=gen).to(x.device)).to(x.dtype)
                for x in pixels]


class PixelHook:
    """Inside one `generate` call: keeps the pixels `generate` encodes once per prompt (its
    `get_image_features` call, before it repeats the features for the G members), then, at the
    first forward over all N rows, swaps each noisy row's image features for those of its noisy
    pixels. The clean rows keep the very features `generate` computed."""

    def __init__(self, plan: PixelPlan, owner: nn.Module, token_id: int):
        self.plan, self.owner, self.token_id = plan, owner, token_id
        self.original = owner.get_image_features
        self.captured: dict[str, Any] | None = None
        self.applied = 0
        # generate reads the encoder's signature to pick its arguments: keep the original's
        @functools.wraps(self.original)
        def encode(**kwargs):
            if self.captured is None:
                self.captured = dict(kwargs)
            return self.original(**kwargs)
        self.encode = encode

    def blocks(self) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
        """The captured call's pixels per image, with each image's own extra arguments."""
        pixels, grid = self.captured["pixel_values"], self.captured.get("image_grid_thw")
        rest = {k: v for k, v in self.captured.items() if k not in ("pixel_values", "image_grid_thw")}
        if grid is not None:
            parts = torch.split(pixels, grid.prod(-1).tolist())
            return list(parts), [{**rest, "image_grid_thw": grid[i:i + 1]} for i in range(len(parts))]
        if pixels.dim() == 4:                       # [images, C, H, W]
            return [pixels[i:i + 1] for i in range(pixels.shape[0])], [rest] * pixels.shape[0]
        raise RuntimeError(f"image_noise branching: pixel values of shape {list(pixels.shape)} "
                           "without image_grid_thw are not split per image here; use kind: latent_noise")

    def __call__(self, module, args, kwargs):
        mm, ids = kwargs.get("mm_encoder_outputs") or {}, kwargs.get("input_ids")
        if self.applied or ids is None or ids.shape[0] != len(self.plan.flags):
            return None
        self.applied += 1
        image = mm.get("image")
        if image is None or self.captured is None:
            return None                             # no image in this call
        if getattr(image, "deepstack_features", None) is not None:
            raise RuntimeError("image_noise branching: this family also feeds per-layer image "
                               "features (DeepStack), which are not swapped; use kind: latent_noise")
        pixels, extra = self.blocks()
        entries, out = list(image.pooler_output), []
        tokens = (ids == self.token_id).sum(dim=1).tolist()                      # [N]
        G, j, first = self.plan.group_size, 0, 0      # j: next entry; first: prompt's 1st image
        for r, need in enumerate(tokens):
            if r % G == 0 and r:
                first += count
            count, got = 0, 0
            while got < need:
                got += entries[j + count].shape[0]
                count += 1
            mine = entries[j:j + count]
            if self.plan.flags[r] and count:
                noisy = self.plan.noisy(r, pixels[first:first + count])
                mine = [self.original(pixel_values=x, **extra[first + i]).pooler_output[0]
                        .to(entries[j + i].dtype) for i, x in enumerate(noisy)]
            out += mine
            j += count
        swapped = copy.copy(image)
        swapped.pooler_output = out
        return args, {**kwargs, "mm_encoder_outputs": {**mm, "image": swapped}}


def image_token_id(model: nn.Module) -> int:
    config = model.config
    for key in ("image_token_id", "image_token_index"):
        value = getattr(config, key, None)
        if value is not None:
            return int(value)
    raise RuntimeError(f"image_noise branching: {type(model).__name__}'s config names no "
                       "image_token_id; use kind: latent_noise")


@contextmanager
def pixel_noise(model: nn.Module, plan: PixelPlan) -> Iterator[PixelHook | None]:
    """Noisy pixels for `plan`'s flagged rows in one `generate` call; everything is put back on
    exit, also on errors."""
    if not plan.active:
        yield None
        return
    top = top_module(model)
    owner = top.base_model
    if "mm_encoder_outputs" not in inspect.signature(top.forward).parameters \
            or not hasattr(owner, "get_image_features"):
        raise RuntimeError(f"image_noise branching: {type(top).__name__} does not encode its images "
                           "once before generating (no mm_encoder_outputs); use kind: latent_noise")
    hook = PixelHook(plan, owner, image_token_id(top))
    owner.get_image_features = hook.encode
    handle = top.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield hook
    finally:
        handle.remove()
        del owner.get_image_features                 # the class's method again


def make_pixel_plan(config: ImageNoiseConfig, n_prompts: int, group_size: int) -> PixelPlan:
    """The plan of one call; one draw from torch's global RNG only when noise is on."""
    k = config.noisy_members(group_size)
    N = n_prompts * group_size
    flags = [g >= group_size - k for _ in range(n_prompts) for g in range(group_size)]
    seeds = [0] * N
    if config.sigma > 0 and k > 0:
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 62, (1,))))
        fresh = torch.randint(0, 2 ** 62, (N,), generator=gen).tolist()
        seeds = [s if f else 0 for s, f in zip(fresh, flags)]
    return PixelPlan(config.sigma, group_size, flags, seeds)
