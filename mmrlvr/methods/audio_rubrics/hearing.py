"""Models that hear the audio: the rubric writer's and the judge's back ends.

A `Hearer` answers a batch of requests, each `(system, text, audios)`, with one reply text or
one `JudgeError` per request (so one bad reply never sinks the batch):

    LocalHearer   an audio-language model of a supported family (Qwen2-Audio, Qwen2.5-Omni,
                  Qwen3-Omni), loaded in process with the trainer's own loaders
                  (`mmrlvr.train.policy`: `load_family`, `load_processor`, `load_model`), its
                  prompts built by the audio adapter (`modalities`: the family's chat template,
                  the clip through its feature extractor), generated greedily in batches through
                  the HF rollout engine (`mmrlvr.rollout.hf`). Frozen: eval mode, no gradients.
                  `writer: policy` / `judge: policy` is this over `model.path`: the weights the
                  run started from (our reading of "a frozen snapshot taken at start"; a resumed
                  run loads the same weights, not the checkpoint's).
    HTTPHearer    an OpenAI-compatible endpoint that takes audio: the user turn is the clip(s) as
                  `input_audio` content parts (base64 16-bit wav at 16 kHz) then the text,
                  through `mmrlvr.core.chat_client`; `audio: false` sends the text alone.
    TextHearer    the text-only local model of `llm.hf_completion` (`{kind: hf}`): it reads the
                  measured evidence, hears nothing.

`make_hearer(spec, who, policy_path)` builds one from a writer/judge spec (see `roles.py`).
`name` is the hearer's identity (what the rubric cache keys on).
"""
from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mmrlvr.methods.audio_rubrics.checks import JudgeError
from mmrlvr.methods.audio_rubrics.llm import http_completion

Request = tuple[str, str, list[Any]]
"""(system prompt, user text, audio sources: paths or (array, rate) pairs)."""


class LocalHearer:
    """An audio-language model in this process, generating batched and greedily."""

    def __init__(self, path: str, name: str | None = None, device: str = "auto",
                 max_new_tokens: int = 512, batch_size: int = 8, dtype: str = "auto",
                 state: dict[str, Any] | None = None):
        self.path, self.name = str(path), name or f"local:{Path(path).resolve()}"
        self.device_name, self.dtype_name = device, dtype
        self.max_new_tokens, self.batch_size = int(max_new_tokens), max(1, int(batch_size))
        self.state = {} if state is None else state
        """Holds the loaded engine; hearers of one model dir share it (one copy of the weights)."""

    def _load(self) -> Any:
        import torch

        import modalities
        from mmrlvr.rollout.hf import HFRolloutEngine
        from mmrlvr.train.policy import Policy, load_family, load_model, load_processor, pick_dtype

        family = load_family(self.path)
        if family.modality != "audio":
            raise ValueError(f"{self.path} is a {family.name} model; an AudioRubrics writer or "
                             "judge must hear the audio: give a Qwen2-Audio, Qwen2.5-Omni or "
                             "Qwen3-Omni dir, or an endpoint {kind: http, url: ...}")
        device = torch.device("cuda" if self.device_name == "auto" and torch.cuda.is_available()
                              else ("cpu" if self.device_name == "auto" else self.device_name))
        dtype = pick_dtype(self.dtype_name, device)
        processor = load_processor(self.path)
        model = load_model(self.path, dtype, family=family).to(device).eval()
        model.requires_grad_(False)
        adapter = modalities.get("audio")
        adapter.bind(family)
        return HFRolloutEngine(Policy(model, processor, adapter, device, compute_dtype=dtype))

    def generate(self, requests: list[Request]) -> list[str | JudgeError]:
        from mmrlvr.data import DataError, Example
        from mmrlvr.rollout.base import SamplingParams

        if "engine" not in self.state:
            self.state["engine"] = self._load()
        engine, out = self.state["engine"], []
        params = SamplingParams(n=1, max_new_tokens=self.max_new_tokens, greedy=True)
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start:start + self.batch_size]
            examples = [Example(id=f"rubric-request-{start + k}", prompt=text, answer="",
                                audios=list(audios), meta={"system": system})
                        for k, (system, text, audios) in enumerate(chunk)]
            try:
                batch = engine.policy.adapter.encode(examples, engine.policy.processor)
                out.extend(engine.generate(batch, params).texts)
            except (DataError, RuntimeError, ValueError, IndexError) as err:
                out.extend([JudgeError(f"{self.name}: {type(err).__name__}: {err}")] * len(chunk))
        return out


def wav_part(source: Any, rate: int = 16000) -> dict[str, Any]:
    """One clip as an OpenAI `input_audio` content part (base64 16-bit PCM wav, mono, `rate`)."""
    import numpy as np
    import soundfile as sf

    if isinstance(source, (tuple, list)) and len(source) == 2:
        import librosa

        wave = np.asarray(source[0], dtype=np.float32)
        wave = wave if int(source[1]) == rate else librosa.resample(
            wave, orig_sr=int(source[1]), target_sr=rate)
    else:
        from mmrlvr.data.media import read_audio

        wave = read_audio(source, rate)
    buf = io.BytesIO()
    sf.write(buf, np.clip(wave, -1.0, 1.0), rate, format="WAV", subtype="PCM_16")
    return {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(buf.getvalue()).decode("ascii"),
                            "format": "wav"}}


class HTTPHearer:
    """An OpenAI-compatible chat endpoint; requests of a batch are sent `concurrency` at a time."""

    def __init__(self, url: str, model: str = "", timeout_s: float = 60.0, max_tokens: int = 1024,
                 api_key_env: str = "OPENAI_API_KEY", audio: bool = True, concurrency: int = 4):
        self.audio, self.concurrency = bool(audio), max(1, int(concurrency))
        self.name = f"http:{url}#{model}" + ("" if audio else "#text")
        self._complete = http_completion(url, model, timeout_s, max_tokens, api_key_env)

    def messages(self, request: Request) -> list[dict[str, Any]]:
        system, text, audios = request
        content: Any = text
        if self.audio and audios:
            content = [*(wav_part(a) for a in audios), {"type": "text", "text": text}]
        return [{"role": "system", "content": system}, {"role": "user", "content": content}]

    def _one(self, request: Request) -> str | JudgeError:
        try:
            return self._complete(self.messages(request))
        except JudgeError as err:
            return err
        except (OSError, ValueError, RuntimeError) as err:      # an unreadable clip
            return JudgeError(f"{self.name}: {type(err).__name__}: {err}")

    def generate(self, requests: list[Request]) -> list[str | JudgeError]:
        if len(requests) <= 1 or self.concurrency == 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="rubric-http") as pool:
            return list(pool.map(self._one, requests))


class TextHearer:
    """`complete(messages)` of a text-only model, one request at a time; audio is not sent."""

    def __init__(self, complete: Any, name: str):
        self.complete, self.name = complete, name

    def generate(self, requests: list[Request]) -> list[str | JudgeError]:
        out: list[str | JudgeError] = []
        for system, text, _ in requests:
            try:
                out.append(self.complete([{"role": "system", "content": system},
                                          {"role": "user", "content": text}]))
            except JudgeError as err:
                out.append(err)
        return out


__all__ = ["HTTPHearer", "LocalHearer", "Request", "TextHearer", "wav_part"]
