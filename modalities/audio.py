"""Audio adapter for Qwen2-Audio (`Qwen2AudioForConditionalGeneration` + its Whisper feature extractor)
and the Qwen2.5-Omni thinker (`Qwen2_5OmniThinkerForConditionalGeneration`, text out).

Audio comes from wav/flac/mp3/ogg files (soundfile; librosa/audioread for anything soundfile cannot
read) or from `(array, sample_rate)` pairs; it is mixed down to mono and resampled to the feature
extractor's rate. A clip longer than the model's feature window (`chunk_length` seconds) is cut to
the window (`long_audio="truncate"`, default) or split into consecutive windows, each its own audio
entry in the prompt (`long_audio="chunk"`); either way a warning names the file and both durations.
A missing, unreadable, empty or non-finite file is a `DataError` naming the sample and the file; a
silent one is a warning.

Tensors: `input_features` [n_audio, mel, frames] and `feature_attention_mask` [n_audio, frames] are
indexed by audio, not by sample; `PromptBatch.media_rows[i]` records each sample's audio rows, so
samples with 0, 1 or several audios mix in one batch.

Encode once per prompt. The audio encoder dominates the cost of a small audio LM, and the stock
paths run it once per sequence: `generate(num_return_sequences=G)` repeats `input_features` G times
before the encoder, and a training forward over G completions of a prompt re-encodes G copies.
Here the encoder runs once per distinct prompt (`audio_embeddings`), its output is scattered into
the text embeddings at the `<|AUDIO|>` positions (`merge_embeddings`), and the model is driven with
`inputs_embeds`: in rollout (`generation_inputs`) and in every logprob recompute (`shared_media` +
`apply_media`). Gradients of the shared features add up over the copies, as they would per copy.
`bench/audio_encode_once.py` measures the saving.

Positions: Qwen2-Audio's text model uses standard 1-D RoPE; positions come from the attention mask
(`cumsum - 1`), as `generate` computes them, so a left-padded row sees the positions it has alone.
The Omni thinkers use 3-D M-RoPE with audio tokens placed by time (`get_rope_index` over the ids,
the mask and each clip's length). Either way the family computes them (`mmrlvr.models`), and the
rollout hands the same positions to `generate` (`mmrlvr.rollout.hf.prompt_positions`), so a
prompt may hold several clips.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrlvr.data import DataError, Example
from mmrlvr.data.media import AudioWarning, describe_source, read_audio
from mmrlvr.core.types import PromptBatch
from modalities.base import Adapter

AUDIO_TOKEN = "<|AUDIO|>"
LONG_AUDIO = ("truncate", "chunk")


WARN_FIRST = 3
"""Clips over the window named in a warning; the rest are counted (`AudioAdapter.cut`)."""


class AudioAdapter(Adapter):
    name = "audio"
    media_keys = ("input_features", "feature_attention_mask")
    placeholder_tokens = (AUDIO_TOKEN, "<|audio_bos|>", "<|audio_eos|>")

    def __init__(self, long_audio: str = "truncate", cache_size: int = 4096, **options: Any):
        super().__init__(**options)
        if long_audio not in LONG_AUDIO:
            raise ValueError(f"long_audio is {long_audio!r}; choose one of {list(LONG_AUDIO)}")
        self.long_audio = long_audio
        self.cut = 0
        """Clips longer than the model's window (cut or split), counted over every file; the
        first `WARN_FIRST` are warned about by name, the rest only counted."""
        self._cache: OrderedDict[tuple, list[np.ndarray]] = OrderedDict()
        self._cache_size = cache_size

    # -- loading ----------------------------------------------------------------------------
    def load_audio(self, source: Any, example: Example, sampling_rate: int, window: int
                   ) -> list[np.ndarray]:
        """One source as a list of clips no longer than `window` samples (cached by path)."""
        key = (str(source), sampling_rate, window) if isinstance(source, (str, Path)) else None
        if key is not None and key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        wave = read_audio(source, sampling_rate, sample=example.id)
        clips = [wave]
        if len(wave) > window:
            seconds, limit = len(wave) / sampling_rate, window / sampling_rate
            if self.long_audio == "truncate":
                clips = [wave[:window]]
                what = f"cut to the first {limit:g} s"
            else:
                clips = [wave[i:i + window] for i in range(0, len(wave), window)]
                what = f"split into {len(clips)} windows of up to {limit:g} s"
            self.cut += 1
            if self.cut <= WARN_FIRST:     # a task of long clips would print one per file
                more = (f"; further clips over the window are {what.split(' ')[0]} the same way "
                        "without a warning (counted in the adapter's `cut`)"
                        if self.cut == WARN_FIRST else "")
                warnings.warn(f"sample {example.id}: audio {describe_source(source)} lasts "
                              f"{seconds:.2f} s, longer than the model's {limit:g} s window; "
                              f"{what}{more}", AudioWarning, stacklevel=2)
        if key is not None:
            self._cache[key] = clips
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return clips

    def vllm_media(self, example: Example, processor: Any = None, sampling_rate: int = 16000,
                   window: int = 30 * 16000) -> dict[str, list]:
        """The example's audio as vLLM's `multi_modal_data` (`(array, rate)` pairs)."""
        clips = [c for a in example.audios for c in self.load_audio(a, example, sampling_rate, window)]
        return {"audio": [(c, sampling_rate) for c in clips]} if clips else {}

    # -- prompts ----------------------------------------------------------------------------
    def build_messages(self, example: Example, system_prompt: str = "", format_prompt: str = "",
                       n_audio: int | None = None) -> list[dict[str, Any]]:
        n = len(example.audios) if n_audio is None else n_audio
        # an "audio" key as well as the type: Qwen2-Audio-Instruct's template tests for the key
        return self.chat([{"type": "audio", "audio": f"audio-{k}"} for k in range(n)], example,
                         system_prompt, format_prompt)

    def encode(self, examples: list[Example], processor: Any, system_prompt: str = "",
               format_prompt: str = "", **_: Any) -> PromptBatch:
        fe = processor.feature_extractor
        family = self.family_of(processor)
        token = family.audio_token
        sr, window = int(fe.sampling_rate), int(fe.n_samples)
        texts, clips, per_sample = [], [], []
        for ex in examples:
            mine = [c for a in ex.audios for c in self.load_audio(a, ex, sr, window)]
            text = processor.apply_chat_template(
                self.build_messages(ex, system_prompt, format_prompt, len(mine)),
                tokenize=False, add_generation_prompt=True)
            if text.count(token) != len(mine):
                raise DataError(f"sample {ex.id}: the prompt holds {text.count(token)} audio "
                                f"placeholders for {len(mine)} audio clip(s); remove literal "
                                f"{token} text from the question")
            texts.append(text)
            clips.extend(mine)
            per_sample.append(len(mine))
        inputs = processor(text=texts, audio=clips or None, sampling_rate=sr, padding=True,
                           return_tensors="pt", add_special_tokens=False)   # the template's are all
        inputs = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
        rows, start = [], 0
        for n in per_sample:
            rows.append({k: (start, start + n) for k in self.media_keys} if n else {})
            start += n
        self._check_token_counts(family, inputs, rows, examples, processor)
        return PromptBatch(list(examples), inputs, rows, texts,
                           {"system_prompt": system_prompt, "format_prompt": format_prompt})

    @staticmethod
    def _check_token_counts(family, inputs, rows, examples, processor) -> None:
        """Audio-token count must equal the encoder outputs each sample's clips produce."""
        audio_id = processor.tokenizer.convert_tokens_to_ids(family.audio_token)
        lengths = family.output_lengths(inputs["feature_attention_mask"].sum(-1)).tolist() \
            if "feature_attention_mask" in inputs else []
        for i, (ex, r) in enumerate(zip(examples, rows)):
            tokens = int((inputs["input_ids"][i] == audio_id).sum())
            features = sum(lengths[slice(*r["feature_attention_mask"])]) if r else 0
            if tokens != features:
                raise DataError(f"sample {ex.id}: {tokens} audio tokens in the prompt but its clips "
                                f"give {features} encoder outputs; check that the prompt holds no "
                                f"literal {family.audio_token} and the processor matches the model")

    # -- model side -------------------------------------------------------------------------
    def shared_media(self, model: torch.nn.Module, batch: PromptBatch, rows: list[int],
                     device: torch.device, dtype: torch.dtype) -> dict[str, Any] | None:
        found = self.distinct_media(batch, rows)
        if found is None:
            return None
        distinct, inputs, media_rows = found
        per_audio = self.family_of(None).encode_audio(model, inputs["input_features"].to(device, dtype),
                                                      inputs["feature_attention_mask"].to(device))
        per_row = {i: per_audio[slice(*r["input_features"])] for i, r in zip(distinct, media_rows)}
        return {"audio_embeds": [f for i in rows for f in per_row.get(i, ())]}  # token order

    def apply_media(self, model: torch.nn.Module, inputs: dict[str, Any], media: dict[str, Any]
                    ) -> dict[str, Any]:
        """Replace the raw audio by `inputs_embeds` holding the shared encoder outputs.

        The ids and `feature_attention_mask` stay (the Omni thinker's positions need them); with
        `inputs_embeds` given and no `input_features`, neither model embeds or encodes again.
        """
        out = {k: v for k, v in inputs.items() if k != "input_features"}
        out["inputs_embeds"] = merge_embeddings(model, self.family_of(None), inputs["input_ids"],
                                                media["audio_embeds"])
        return out

    def generation_inputs(self, model: torch.nn.Module, batch: PromptBatch,
                          inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`generate` kwargs: each prompt's audio encoded once, as `inputs_embeds` [B, P, D].

        `input_ids` stay so the output sequences keep the prompt; `generate` repeats the
        embeddings for the G return sequences instead of re-running the encoder on G copies.
        """
        if "input_features" not in inputs:
            return inputs
        media = self.shared_media(model, batch, list(range(len(batch))), inputs["input_ids"].device,
                                  inputs["input_features"].dtype)
        out = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"],
               "inputs_embeds": merge_embeddings(model, self.family_of(None), inputs["input_ids"],
                                                 media["audio_embeds"])}
        if self.family_of(None).time_positions:
            out["feature_attention_mask"] = inputs["feature_attention_mask"]
        return out


def merge_embeddings(model: torch.nn.Module, family: Any, input_ids: torch.Tensor,
                     audio_embeds: list[torch.Tensor]) -> torch.Tensor:
    """Text embeddings [N, T, D] with `audio_embeds` (in token order) at the audio tokens."""
    embeds = model.get_input_embeddings()(input_ids)                          # [N, T, D]
    is_audio = input_ids == family.audio_token_id(model)                      # [N, T]
    n_tokens = int(is_audio.sum())
    if not audio_embeds:
        if n_tokens:
            raise ValueError(f"{n_tokens} audio tokens but no audio features were given")
        return embeds
    flat = torch.cat(audio_embeds).to(embeds.device, embeds.dtype)           # [n_tokens, D]
    if flat.shape[0] != n_tokens:
        raise ValueError(f"{n_tokens} audio tokens but {flat.shape[0]} audio features")
    return embeds.masked_scatter(is_audio.unsqueeze(-1), flat)

