"""Vision adapter: images into the prompts of any vision family (`mmrlvr.models`).

Images load through PIL (a missing or corrupt file is an error naming the sample) and are resized
as the model's family does it (Qwen-VL: qwen-vl-utils to multiples of patch × merge within
`min_pixels`/`max_pixels`, then the processor with `do_resize=False`; Gemma 3: the processor's own
fixed size); the processor runs once per prompt (never per rollout copy). The family says what
one image's placeholder is, how `pixel_values` splits per sample (so samples are cut out whole),
how many tokens an image makes, the positions and how shared image features are passed.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from mmrlvr.data import DataError, Example
from mmrlvr.core.types import PromptBatch
from modalities.base import Adapter


class VisionAdapter(Adapter):
    name = "vision"
    media_keys = ("pixel_values", "image_grid_thw")
    placeholder_tokens = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>",
                          "<|vision_pad|>")
    """Qwen-VL's; a bound family's (`mmrlvr.models`) take their place."""

    def __init__(self, min_pixels: int = 56 * 56, max_pixels: int = 112 * 112,
                 cache_size: int = 8192, video_fps: float = 2.0, max_frames: int = 16,
                 max_video_pixels: int = 0, **options: Any):
        super().__init__(**options)
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.video_fps, self.max_frames = video_fps, max_frames
        self.max_video_pixels = max_video_pixels or max_pixels
        """Largest frame area after resizing (`data.max_video_pixels`; 0: `max_pixels`)."""
        self._clips: OrderedDict[str, Any] = OrderedDict()
        self._cache: OrderedDict[str, Image.Image] = OrderedDict()
        self._cache_size = cache_size
        self.upscaled = 0
        """Images smaller than `min_pixels`, resized up (a warning names the first)."""

    def load_image(self, image: Any, example: Example, processor: Any = None) -> Image.Image:
        """Open and resize one image (cached by path); errors name the sample and file."""
        family = self.family_of(processor)
        key = image if isinstance(image, str) else None
        if key is not None and key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if isinstance(image, Image.Image):
            pil = image
        else:
            try:
                with Image.open(image) as fh:
                    fh.load()
                    pil = fh.copy()
            except FileNotFoundError:
                raise DataError(f"sample {example.id}: image not found: {image}") from None
            except Exception as err:  # PIL raises several types for bad files
                raise DataError(f"sample {example.id}: cannot read image {image}: {err}") from None
        if family.pixel_bounds and pil.width * pil.height < self.min_pixels:
            self.upscaled += 1
            if self.upscaled == 1:
                sample = getattr(example, "id", "?")
                warnings.warn(f"sample {sample}: image {pil.width}x{pil.height} px is below the "
                              f"model's minimum of {self.min_pixels} pixels (model.min_pixels); it "
                              "is resized up, and so is every such image (counted in the adapter's "
                              "`upscaled`)", stacklevel=2)
        resized = family.resize(pil, processor, self.min_pixels, self.max_pixels)
        if key is not None:
            self._cache[key] = resized
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return resized

    def load_video(self, video: Any, k: int, example: Example, processor: Any = None) -> Any:
        """One video as a `Clip` of sampled frames (`data.video_fps`, `data.max_frames`), each
        frame resized as the family resizes images, within `data.max_video_pixels` (cached by
        path); errors name the sample and the video."""
        from mmrlvr.data.video import Clip, read_video

        if isinstance(video, Clip):                     # sampled and resized already (the demo)
            return video
        family = self.family_of(processor)
        key = str(video) if isinstance(video, (str, Path)) else None
        if key is not None and key in self._clips:
            self._clips.move_to_end(key)
            return self._clips[key]
        try:
            clip = read_video(video, fps=self.video_fps, max_frames=self.max_frames,
                              what=f"sample {example.id}: video {k}"
                              + (f" ({video})" if key is not None else ""))
        except ValueError as err:
            raise DataError(str(err)) from None
        frames = [family.resize(frame, processor, min(self.min_pixels, self.max_video_pixels),
                                self.max_video_pixels) for frame in clip.frames]
        clip = replace(clip, frames=frames)
        if key is not None:
            self._clips[key] = clip
            if len(self._clips) > max(1, self._cache_size // 64):
                self._clips.popitem(last=False)
        return clip

    def vllm_media(self, example: Example, processor: Any = None) -> dict[str, list[Image.Image]]:
        """The example's images as vLLM's `multi_modal_data` (resized like the HF path)."""
        if example.videos:
            raise DataError(f"sample {example.id}: video rows roll out with rollout.backend: hf "
                            "only (the vLLM engine gets no video yet)")
        return {"image": [self.load_image(img, example, processor) for img in example.images]} \
            if example.images else {}

    def build_messages(self, example: Example, system_prompt: str = "",
                       format_prompt: str = "") -> list[dict[str, Any]]:
        media = [{"type": "image"} for _ in example.images]
        media += [{"type": "video"} for _ in example.videos]
        return self.chat(media, example, system_prompt, format_prompt)

    def encode(self, examples: list[Example], processor: Any, system_prompt: str = "",
               format_prompt: str = "", **_: Any) -> PromptBatch:
        family = self.family_of(processor)
        texts, images, clips, per_sample, per_video = [], [], [], [], []
        for ex in examples:
            messages = self.build_messages(ex, system_prompt, format_prompt)
            text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            self._check_placeholders(family, ex, text)
            texts.append(text)
            loaded = [self.load_image(img, ex, processor) for img in ex.images]
            images.append(loaded)
            per_sample.append(len(loaded))
            clips += [self.load_video(video, k, ex, processor) for k, video in enumerate(ex.videos)]
            per_video.append(len(ex.videos))
        images = family.processor_images(images)
        # the chat template writes every special token (Gemma's <bos> too): add none again
        kwargs = family.processor_kwargs if images or clips else {}
        inputs = processor(text=texts, images=images, padding=True, return_tensors="pt",
                           add_special_tokens=False, **kwargs,
                           **(family.video_kwargs(clips, processor) if clips else {}))
        inputs = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
        media_rows = family.media_rows(inputs, per_sample, processor)
        if clips:
            for row, videos in zip(media_rows, family.video_rows(inputs, per_video)):
                row.update(videos)
        self._check_token_counts(family, inputs, media_rows, examples, processor)
        return PromptBatch(list(examples), inputs, media_rows, texts,
                           {"system_prompt": system_prompt, "format_prompt": format_prompt})

    def shared_media(self, model: torch.nn.Module, batch: PromptBatch, rows: list[int],
                     device: torch.device, dtype: torch.dtype) -> dict[str, Any] | None:
        found = self.distinct_media(batch, rows)
        if found is None:
            return None
        family = self.family_of(None)
        distinct, inputs, media_rows = found
        outputs = {}
        for kind, key, encode in (("image", family.image_key, "encode_images"),
                                  ("video", family.video_key, "encode_videos")):
            items = {i: r[key] for i, r in zip(distinct, media_rows) if key is not None and key in r}
            if items:
                encoded = getattr(family, encode)(model, inputs, device, dtype)
                outputs[kind] = family.pick_features(encoded, [items[i] for i in rows if i in items])
        return {"mm_encoder_outputs": outputs}

    @staticmethod
    def _check_placeholders(family, ex: Example, text: str) -> None:
        """One placeholder per image and per video in the templated prompt, and no video for a
        family without a video path."""
        marker = family.image_marker or family.image_token
        if text.count(marker) != len(ex.images):
            raise DataError(
                f"sample {ex.id}: the prompt holds {text.count(marker)} image "
                f"placeholders ({marker}, the {family.name} chat template's) for "
                f"{len(ex.images)} image(s); remove literal {marker} text from the question")
        if ex.videos and family.video_key is None:
            raise DataError(f"sample {ex.id}: {len(ex.videos)} video(s), but mmrlvr has no video "
                            f"path for the {family.name} family (video trains on Qwen2-VL, "
                            "Qwen2.5-VL, Qwen3-VL and Qwen3.5); drop the row or its videos")
        if family.video_token and text.count(family.video_token) != len(ex.videos):
            raise DataError(
                f"sample {ex.id}: the prompt holds {text.count(family.video_token)} video "
                f"placeholders ({family.video_token}) for {len(ex.videos)} video(s); remove "
                f"literal {family.video_token} text from the question")

    @staticmethod
    def _check_token_counts(family, inputs, media_rows, examples, processor) -> None:
        """Image- and video-token counts must equal the features each sample's media produce."""
        for kind, token, count in (("image", family.image_token, family.image_features),
                                   ("video", family.video_token, getattr(family, "video_features", None))):
            if token is None or count is None:
                continue
            pad_id = processor.tokenizer.convert_tokens_to_ids(token)
            for i, (ex, rows) in enumerate(zip(examples, media_rows)):
                tokens = int((inputs["input_ids"][i] == pad_id).sum())
                features = count(inputs, rows, processor)
                if tokens != features:
                    n = len(ex.images if kind == "image" else ex.videos)
                    raise DataError(
                        f"sample {ex.id}: {tokens} {kind} tokens in the prompt but its {n} "
                        f"{kind}(s) give {features} features; check that the prompt text holds no "
                        f"literal {token} and the processor matches the model")
