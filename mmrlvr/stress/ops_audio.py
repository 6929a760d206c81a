"""Audio stress operators for `mmrlvr stress`: corruptions that leave the answer audible.

Each operator loads every clip of an example (mono, at its own rate), corrupts it and hands the
adapter an `(array, rate)` pair; examples without audio are skipped (None). Noise is drawn from a
generator seeded by (seed, operator, example id) like every other operator (`stress_ops._rng`).

    noise_snr      white noise at 20 dB SNR (relative to the clip's RMS)
    clipping       hard clipping at 30% of the peak (then scaled back to the old peak)
    resample       down to 8 kHz and back up: everything above 4 kHz is lost
    time_shift     0.1 s of silence before the clip, the end cut to keep the length
    loudness       12 dB quieter

Listed in `mmrlvr.stress.OPERATORS` under the kind `audio`, reported apart from the
prompt operators' robustness figure.
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import numpy as np

from mmrlvr.data import Example

from mmrlvr.stress.ops import Operator, Variant

Clip = tuple[np.ndarray, int]


def load_clip(audio, example: Example) -> Clip:
    """A clip as (mono float32 samples, rate) at its own rate; errors name the sample and file."""
    if isinstance(audio, (tuple, list)) and len(audio) == 2:
        return np.asarray(audio[0], dtype=np.float32), int(audio[1])
    import soundfile as sf

    from modalities.audio import read_audio

    rate = sf.info(str(audio)).samplerate if isinstance(audio, str) else 16000
    return read_audio(audio, rate, sample=example.id), rate


def add_noise(clip: Clip, rng: random.Random, snr_db: float = 20.0) -> Clip:
    wave, sr = clip
    power = float(np.mean(wave.astype(np.float64) ** 2))
    noise = np.random.default_rng(rng.randrange(2 ** 32)).standard_normal(len(wave))
    return (wave + np.sqrt(power / 10 ** (snr_db / 10)) * noise).astype(np.float32), sr


def clip_peaks(clip: Clip, rng: random.Random, level: float = 0.3) -> Clip:
    wave, sr = clip
    peak = float(np.abs(wave).max()) or 1.0
    return (np.clip(wave, -level * peak, level * peak) / level).astype(np.float32), sr


def resample_through(clip: Clip, rng: random.Random, rate: int = 8000) -> Clip:
    import librosa

    wave, sr = clip
    if sr <= rate:
        return clip
    low = librosa.resample(wave, orig_sr=sr, target_sr=rate)
    return librosa.resample(low, orig_sr=rate, target_sr=sr)[:len(wave)].astype(np.float32), sr


def time_shift(clip: Clip, rng: random.Random, seconds: float = 0.1) -> Clip:
    wave, sr = clip
    pad = np.zeros(int(seconds * sr), dtype=np.float32)
    return np.concatenate([pad, wave])[:len(wave)], sr


def gain(clip: Clip, rng: random.Random, db: float = -12.0) -> Clip:
    wave, sr = clip
    return (wave * 10 ** (db / 20)).astype(np.float32), sr


def audio_op(transform: Callable[[Clip, random.Random], Clip]):
    """An operator function `(example, format prompt, rng) -> Variant | None` from a clip transform."""
    def fn(ex, fmt, rng):
        if not ex.audios:
            return None
        return Variant(dataclasses.replace(
            ex, audios=[transform(load_clip(a, ex), rng) for a in ex.audios]), fmt)
    return fn


def operators() -> dict[str, Operator]:
    """The audio operators, by name."""
    ops = [
        Operator("noise_snr", "audio", "white noise at 20 dB SNR", audio_op(add_noise)),
        Operator("clipping", "audio", "hard clipping at 30% of the peak", audio_op(clip_peaks)),
        Operator("resample", "audio", "down to 8 kHz and back (nothing above 4 kHz)",
                 audio_op(resample_through)),
        Operator("time_shift", "audio", "0.1 s of leading silence, length kept", audio_op(time_shift)),
        Operator("loudness", "audio", "12 dB quieter", audio_op(gain)),
    ]
    return {op.name: op for op in ops}
