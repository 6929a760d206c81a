"""Acoustic evidence computed from the waveform, and the static rubrics written from it.

`extract_evidence(wave, sr)` measures, with librosa and numpy:

    duration_s            length of the clip
    loudness              RMS level in dBFS: mean, peak, first and second half, a 10-point curve
    pitch                 YIN f0 track over the sounding frames: median and a 10-point curve (Hz)
    events                sounding stretches (energy within `top_db` of the peak; gaps under
                          40 ms merged): start, end, duration, median pitch, level
    onset_count/_times_s  the events' starts
    tempo                 onsets per minute from the median inter-onset interval, and the onset
                          rate (per second) in each half of the clip
    spectral_centroid_hz  energy-weighted mean spectral centroid

Everything is a plain JSON value (floats rounded), so it is stored with the dataset and shown to
judges verbatim. `static_rubrics(evidence, question)` turns it into ~5 weighted rubrics (category,
criterion, weight summing to 1, polarity, and a machine check the rule-based judge evaluates):
the acoustic facts a correct reasoning should state, ranked by how much the question asks about
them, plus grounding and brevity.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 16000
"""Evidence is computed at this rate (Qwen2-Audio's) whatever the file's rate."""
ATTRIBUTES = ("pitch", "loudness", "tempo", "duration")
"""Attributes an order rubric compares between the first and second part of a clip."""
AUDIO_WORDS = ("sound", "sounds", "tone", "tones", "beep", "beeps", "click", "clicks", "pitch",
               "loud", "louder", "quiet", "quieter", "soft", "softer", "high", "higher", "low",
               "lower", "fast", "faster", "slow", "slower", "long", "longer", "short", "shorter",
               "hear", "heard", "audio", "clip", "pattern", "half", "note", "notes", "hz")
"""Words that show a reasoning talks about what it heard (the grounding rubric)."""

_FRAME, _HOP = 1024, 256


def _r(x: float, nd: int = 3) -> float:
    return float(round(float(x), nd))


def _db(power: np.ndarray | float) -> np.ndarray | float:
    return 10.0 * np.log10(np.maximum(power, 1e-12))


def _curve(values: np.ndarray, points: int = 10) -> list[float | None]:
    if len(values) == 0:
        return []
    out = []
    for part in np.array_split(values, min(points, len(values))):
        part = part[np.isfinite(part)]
        out.append(_r(np.median(part), 1) if len(part) else None)
    return out


def _events(wave: np.ndarray, sr: int, top_db: float, min_gap_s: float) -> list[tuple[int, int]]:
    import librosa

    if float(np.abs(wave).max()) < 1e-6:
        return []
    spans = librosa.effects.split(wave, top_db=top_db, frame_length=512, hop_length=64)
    merged: list[list[int]] = []
    for start, stop in spans:
        if merged and (start - merged[-1][1]) < min_gap_s * sr:
            merged[-1][1] = int(stop)
        else:
            merged.append([int(start), int(stop)])
    # frame-level edges are off by up to a frame: move them to the first and last sample whose
    # envelope (a 4 ms running max of |x|) reaches the threshold
    from scipy.ndimage import maximum_filter1d

    envelope = maximum_filter1d(np.abs(wave), size=max(1, int(0.004 * sr)))
    threshold = float(np.abs(wave).max()) * 10 ** (-top_db / 20)
    out = []
    for a, b in merged:
        above = np.flatnonzero(envelope[a:b] >= threshold)
        if len(above):
            a, b = a + int(above[0]), a + int(above[-1]) + 1
        if b - a >= 0.005 * sr:
            out.append((a, b))
    return out


def extract_evidence(wave: np.ndarray, sr: int = SAMPLE_RATE, *, top_db: float = 30.0,
                     fmin: float = 60.0, fmax: float = 2500.0) -> dict[str, Any]:
    """The evidence dict of one mono clip (see the module doc)."""
    import librosa

    wave = np.asarray(wave, dtype=np.float32)
    if sr != SAMPLE_RATE:
        wave = librosa.resample(wave, orig_sr=sr, target_sr=SAMPLE_RATE)
        sr = SAMPLE_RATE
    n = len(wave)
    duration = n / sr
    rms = librosa.feature.rms(y=wave, frame_length=_FRAME, hop_length=_HOP, center=True)[0]   # [F]
    power = rms ** 2
    times = librosa.frames_to_time(np.arange(len(rms)), sr=sr, hop_length=_HOP)             # [F]
    half = duration / 2
    first, second = power[times < half], power[times >= half]
    loudness = {"mean_db": _r(_db(power.mean()), 1), "peak_db": _r(_db(power.max()), 1),
                "first_half_db": _r(_db(first.mean() if len(first) else 0.0), 1),
                "second_half_db": _r(_db(second.mean() if len(second) else 0.0), 1),
                "curve_db": _curve(_db(power))}

    sounding = _db(power) > _db(power.max()) - top_db if power.max() > 1e-12 else power > 1
    if n >= _FRAME:
        f0 = librosa.yin(wave, fmin=fmin, fmax=fmax, sr=sr, frame_length=_FRAME, hop_length=_HOP)
        f0 = f0[:len(sounding)]
        f0 = np.where(sounding[:len(f0)], f0, np.nan)
    else:
        f0 = np.full(len(sounding), np.nan)
    voiced = f0[np.isfinite(f0)]
    pitch = {"median_hz": _r(np.median(voiced), 1) if len(voiced) else None, "curve_hz": _curve(f0)}

    events = []
    for start, stop in _events(wave, sr, top_db, min_gap_s=0.04):
        seg = wave[start:stop]
        ev_pitch = None
        if len(seg) >= _FRAME:
            track = librosa.yin(seg, fmin=fmin, fmax=fmax, sr=sr, frame_length=_FRAME,
                                hop_length=_HOP, center=False)
            ev_pitch = _r(np.median(track), 1)
        events.append({"start_s": _r(start / sr), "end_s": _r(stop / sr),
                       "duration_s": _r((stop - start) / sr), "pitch_hz": ev_pitch,
                       "loudness_db": _r(_db(float(np.mean(seg.astype(np.float64) ** 2))), 1)})
    onsets = [e["start_s"] for e in events]
    ioi = np.diff(onsets)
    tempo = {"bpm": _r(60.0 / np.median(ioi), 1) if len(ioi) else None,
             "first_half_rate": _r(sum(t < half for t in onsets) / half, 2) if half else 0.0,
             "second_half_rate": _r(sum(t >= half for t in onsets) / half, 2) if half else 0.0}
    centroid = librosa.feature.spectral_centroid(y=wave, sr=sr, n_fft=_FRAME, hop_length=_HOP)[0]
    k = min(len(centroid), len(power))
    weight = power[:k] / max(float(power[:k].sum()), 1e-12)
    return {"duration_s": _r(duration), "sample_rate": sr, "loudness": loudness, "pitch": pitch,
            "events": events[:32], "onset_count": len(onsets), "onset_times_s": onsets[:32],
            "tempo": tempo, "spectral_centroid_hz": _r(float((centroid[:k] * weight).sum()), 1)}


_CACHE: OrderedDict[str, dict[str, Any]] = OrderedDict()


def evidence_for(source: Any, *, cache_size: int = 4096) -> dict[str, Any]:
    """Evidence of a file path (cached by path and mtime) or an `(array, rate)` pair."""
    if isinstance(source, (tuple, list)) and len(source) == 2:
        return extract_evidence(np.asarray(source[0], dtype=np.float32), int(source[1]))
    from mmrlvr.data import read_audio

    path = Path(source)
    key = f"{path}:{path.stat().st_mtime_ns}" if path.exists() else str(path)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    evidence = extract_evidence(read_audio(path, SAMPLE_RATE), SAMPLE_RATE)
    _CACHE[key] = evidence
    if len(_CACHE) > cache_size:
        _CACHE.popitem(last=False)
    return evidence


# -- facts and static rubrics ------------------------------------------------------------------
def order_facts(evidence: dict[str, Any]) -> dict[str, str]:
    """Which part of the clip has more of each attribute: {attribute: "first" | "second"}.

    pitch and duration compare the first and last event; loudness and tempo the two halves. An
    attribute is left out where the two sides are too close to call (6% pitch, 25% duration and
    onset rate, 3 dB).
    """
    facts: dict[str, str] = {}
    events = evidence.get("events") or []
    if len(events) >= 2:
        a, b = events[0], events[-1]
        if a.get("pitch_hz") and b.get("pitch_hz"):
            hi, lo = max(a["pitch_hz"], b["pitch_hz"]), min(a["pitch_hz"], b["pitch_hz"])
            if hi >= 1.06 * lo:
                facts["pitch"] = "second" if b["pitch_hz"] > a["pitch_hz"] else "first"
        da, db = a["duration_s"], b["duration_s"]
        if max(da, db) >= 1.25 * max(min(da, db), 1e-3):
            facts["duration"] = "second" if db > da else "first"
    loud = evidence.get("loudness") or {}
    if "first_half_db" in loud and abs(loud["first_half_db"] - loud["second_half_db"]) >= 3.0:
        facts["loudness"] = "first" if loud["first_half_db"] > loud["second_half_db"] else "second"
    tempo = evidence.get("tempo") or {}
    r1, r2 = tempo.get("first_half_rate", 0.0), tempo.get("second_half_rate", 0.0)
    if min(r1, r2) > 0 and max(r1, r2) >= 1.25 * min(r1, r2) and evidence.get("onset_count", 0) >= 4:
        facts["tempo"] = "second" if r2 > r1 else "first"
    return facts


_ASKS = {
    "count": r"\bhow many\b|\bcount\b|\bnumber of\b",
    "pitch": r"\bhigh(er)?\b|\blow(er)?\b|\bpitch\b",
    "loudness": r"\bloud(er)?\b|\bquiet(er)?\b|\bsoft(er)?\b|\bvolume\b",
    "tempo": r"\bfast(er)?\b|\bslow(er)?\b|\btempo\b|\brate\b",
    "duration": r"\blong(er)?\b|\bshort(er)?\b|\bduration\b",
}
_RELATION = {"pitch": "higher in pitch", "loudness": "louder", "tempo": "faster",
             "duration": "longer"}
_PART = {"pitch": "sound", "duration": "sound", "loudness": "half", "tempo": "half"}
_PRIORITY = {"asked": 3.0, "perception": 1.5, "grounding": 1.0, "style": 0.5}


def _order_detail(attribute: str, evidence: dict[str, Any]) -> str:
    events = evidence.get("events") or [{}]
    a, b = events[0], events[-1]
    if attribute == "pitch":
        return f"{a.get('pitch_hz')} Hz then {b.get('pitch_hz')} Hz"
    if attribute == "duration":
        return f"{a.get('duration_s')} s then {b.get('duration_s')} s"
    if attribute == "loudness":
        loud = evidence["loudness"]
        return f"{loud['first_half_db']} dB then {loud['second_half_db']} dB"
    tempo = evidence["tempo"]
    return f"{tempo['first_half_rate']} then {tempo['second_half_rate']} onsets per second"


def static_rubrics(evidence: list[dict[str, Any]] | dict[str, Any], question: str = "",
                   max_rubrics: int = 5, max_words: int = 40) -> list[dict[str, Any]]:
    """Up to `max_rubrics` weighted rubrics (weights sum to 1) written from the evidence.

    Facts the question asks about weigh most, other measured facts less, then grounding (the
    reasoning talks about sound) and brevity. Only the first clip's facts are used.
    """
    ev = evidence[0] if isinstance(evidence, list) else evidence
    if not ev:
        return []
    asked = {k for k, pattern in _ASKS.items() if re.search(pattern, question, re.IGNORECASE)}
    candidates: list[tuple[float, dict[str, Any]]] = []
    n = ev.get("onset_count", 0)
    if n and n <= 12:
        candidates.append((_PRIORITY["asked" if "count" in asked else "perception"], {
            "category": "perception",
            "criterion": f"States that the clip holds {n} distinct sound{'s' if n != 1 else ''} "
                         f"(onsets at {', '.join(f'{t:.2f}' for t in ev['onset_times_s'][:8])} s).",
            "check": {"kind": "count", "value": n}}))
    for attribute, winner in order_facts(ev).items():
        candidates.append((_PRIORITY["asked" if attribute in asked else "perception"], {
            "category": "perception",
            "criterion": f"Says the {winner} {_PART[attribute]} is {_RELATION[attribute]} "
                         f"({_order_detail(attribute, ev)}).",
            "check": {"kind": "order", "attribute": attribute, "winner": winner}}))
    candidates.append((_PRIORITY["grounding"], {
        "category": "grounding",
        "criterion": "Reasons about what is heard (tones, beeps, clicks, pitch, loudness, timing) "
                     "rather than guessing.",
        "check": {"kind": "mentions", "words": list(AUDIO_WORDS)}}))
    candidates.append((_PRIORITY["style"], {
        "category": "style",
        "criterion": f"Keeps the reasoning under {max_words} words.",
        "check": {"kind": "max_words", "value": max_words}}))
    candidates.sort(key=lambda c: -c[0])          # stable: ties keep the order written above
    chosen = candidates[:max_rubrics]
    total = sum(p for p, _ in chosen)
    return [{"id": f"s{k + 1}", **r, "weight": p / total, "polarity": 1}
            for k, (p, r) in enumerate(chosen)]
