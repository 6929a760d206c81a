"""Tones: seeded synthetic audio questions with verifiable answers, MMAU-style multiple choice;
and loaders for MMAU- and AVQA-style JSON layouts.

Every clip is 16 kHz mono, `clip_s` seconds (2 s default, inside the tiny model's 3 s window),
built from pure tones with 10 ms fades and clicks over faint noise. Five families:

    count     How many beeps are in the clip?               4 options from 1-6 (1-5 beeps)
    pitch     Which of the two tones is higher in pitch?    the first tone / the second tone
    loudness  Which half of the clip is louder?             the first half / the second half
    tempo     Is the second click pattern faster or slower? faster / slower
    duration  Is the second tone longer or shorter?         longer / shorter

Differences are made clear (pitch ratio >= 1.5, >= 10 dB, rate ratio >= 1.6, duration ratio
>= 1.8). The answer is fixed first (dealt evenly over each family's answers) and the clip built to
match; options are shuffled, the gold is a letter. Each row's `meta` holds the family, the
generating parameters, the acoustic `evidence` measured from the written file
(`mmrlvr.methods.audio_rubrics.evidence`) and the static `rubrics` written from it, so the AudioRubrics reward
needs no audio decoding at training time. `reasoning` is the supervised warm start's reference
(`reference_reasoning`): the options restated, the quantities the clip was made with (pitch, level,
rate, length), the verdict and the letter.

`make_tones(out, ...)` writes `audio/*.wav`, `train.jsonl`, `test.jsonl` (audio paths relative to
the file) and `info.json`; the same arguments give the same files. `convert(spec, out)` maps an
MMAU (`mmau:FILE.json`) or AVQA / R1-AQA (`avqa:FILE.json[l]`) layout onto the same JSONL,
`out/<FILE stem>.jsonl` (absolute audio paths), with evidence and static rubrics.
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mmrlvr.data import DataError, Example, write_jsonl
from mmrlvr.core.templates import with_options
from mmrlvr.tasks import Task

SR = 16000
FAMILIES = ("count", "pitch", "loudness", "tempo", "duration")
ANSWER_CELLS: dict[str, tuple[Any, ...]] = {
    "count": (1, 2, 3, 4, 5), "pitch": ("first", "second"), "loudness": ("first", "second"),
    "tempo": ("faster", "slower"), "duration": ("longer", "shorter"),
}
"""The answers each family deals evenly."""


def _tone(freq: float, seconds: float, amp: float) -> np.ndarray:
    t = np.arange(int(SR * seconds)) / SR
    wave = amp * np.sin(2 * np.pi * freq * t)
    ramp = min(int(0.01 * SR), len(wave) // 2)
    env = np.ones_like(wave)
    env[:ramp] = np.linspace(0, 1, ramp)
    env[len(env) - ramp:] = np.linspace(1, 0, ramp)
    return wave * env


def _click(rng: np.random.Generator, amp: float) -> np.ndarray:
    n = int(0.015 * SR)
    return amp * rng.standard_normal(n) * np.exp(-np.arange(n) / (0.003 * SR))


def _place(canvas: np.ndarray, sound: np.ndarray, at_s: float) -> None:
    start = int(at_s * SR)
    stop = min(len(canvas), start + len(sound))
    canvas[start:stop] += sound[:stop - start]


def _count(rng: random.Random, nrng: np.random.Generator, clip_s: float, n: int) -> dict[str, Any]:
    canvas = np.zeros(int(SR * clip_s))
    freq, amp = rng.uniform(400, 1200), rng.uniform(0.3, 0.6)
    beep, gap = rng.uniform(0.1, 0.16), rng.uniform(0.12, 0.2)
    start = rng.uniform(0.05, max(0.05, clip_s - n * (beep + gap)))
    for k in range(n):
        _place(canvas, _tone(freq, beep, amp), start + k * (beep + gap))
    options = sorted(rng.sample([m for m in range(1, 7) if m != n], 3) + [n])
    return {"wave": canvas, "question": "How many beeps are in the clip?",
            "choices": [str(m) for m in options], "gold": str(n),
            "verdict": f"I hear {n} beep{'s' if n != 1 else ''}.",
            "params": {"beeps": n, "freq_hz": round(freq, 1), "beep_s": round(beep, 3),
                       "gap_s": round(gap, 3), "start_s": round(start, 3)}}


def _pitch(rng: random.Random, nrng: np.random.Generator, clip_s: float, higher: str
           ) -> dict[str, Any]:
    low = rng.uniform(250, 600)
    high = low * rng.uniform(1.5, 2.5)
    f1, f2 = (high, low) if higher == "first" else (low, high)
    dur, amp = rng.uniform(0.45, 0.7), rng.uniform(0.3, 0.6)
    canvas = np.zeros(int(SR * clip_s))
    _place(canvas, _tone(f1, dur, amp), 0.1)
    _place(canvas, _tone(f2, dur, amp), clip_s - 0.1 - dur)
    return {"wave": canvas, "question": "Two tones play one after the other. Which one is higher in pitch?",
            "choices": ["the first tone", "the second tone"], "gold": f"the {higher} tone",
            "verdict": f"The {higher} tone is higher.",
            "params": {"f1_hz": round(f1, 1), "f2_hz": round(f2, 1), "tone_s": round(dur, 3)}}


def _loudness(rng: random.Random, nrng: np.random.Generator, clip_s: float, louder: str
              ) -> dict[str, Any]:
    freq = rng.uniform(300, 1000)
    loud = rng.uniform(0.4, 0.7)
    quiet = loud * 10 ** (-rng.uniform(10, 18) / 20)
    a1, a2 = (loud, quiet) if louder == "first" else (quiet, loud)
    half = clip_s / 2
    canvas = np.concatenate([_tone(freq, half, a1), _tone(freq, clip_s - half, a2)])
    return {"wave": canvas, "question": "Which half of the clip is louder?",
            "choices": ["the first half", "the second half"], "gold": f"the {louder} half",
            "verdict": f"The {louder} half is louder.",
            "params": {"freq_hz": round(freq, 1), "amp_first": round(a1, 4), "amp_second": round(a2, 4),
                       "difference_db": round(20 * np.log10(max(a1, a2) / min(a1, a2)), 1)}}


def _tempo(rng: random.Random, nrng: np.random.Generator, clip_s: float, second: str
           ) -> dict[str, Any]:
    slow = rng.uniform(2.5, 4.0)
    fast = slow * rng.uniform(1.6, 2.2)
    r1, r2 = (slow, fast) if second == "faster" else (fast, slow)
    amp = rng.uniform(0.4, 0.7)
    canvas = np.zeros(int(SR * clip_s))
    half = clip_s / 2
    for rate, lo in ((r1, 0.0), (r2, half)):
        t = lo + 0.05
        while t < lo + half - 0.05:
            _place(canvas, _click(nrng, amp), t)
            t += 1.0 / rate
    return {"wave": canvas,
            "question": "Two click patterns play one after the other. Is the second pattern faster or "
                        "slower than the first?",
            "choices": ["faster", "slower"], "gold": second,
            "verdict": f"The second pattern is {second}.",
            "params": {"rate_first": round(r1, 2), "rate_second": round(r2, 2)}}


def _duration(rng: random.Random, nrng: np.random.Generator, clip_s: float, second: str
              ) -> dict[str, Any]:
    short = rng.uniform(0.15, 0.35)
    long = short * rng.uniform(1.8, 2.6)
    d1, d2 = (short, long) if second == "longer" else (long, short)
    freq, amp = rng.uniform(300, 1000), rng.uniform(0.3, 0.6)
    canvas = np.zeros(int(SR * clip_s))
    _place(canvas, _tone(freq, d1, amp), 0.1)
    _place(canvas, _tone(freq, d2, amp), 0.1 + d1 + rng.uniform(0.25, 0.4))
    return {"wave": canvas, "question": "Is the second tone longer or shorter than the first?",
            "choices": ["longer", "shorter"], "gold": second,
            "verdict": f"The second tone is {second}.",
            "params": {"first_s": round(d1, 3), "second_s": round(d2, 3), "freq_hz": round(freq, 1)}}


def reference_reasoning(family: str, params: dict[str, Any], verdict: str, choices: list[str],
                        letter: str) -> str:
    """The SFT reference: options restated, the clip's generating quantities, verdict, letter.

    "A is the second tone, B is the first tone. First tone 930 Hz, second tone 580 Hz. The first
    tone is higher, so B." Each step is a short copy or lookup a tiny model learns (README
    "Audio"): a bare verdict followed by the letter left the letter a coin flip. The verdict keeps
    its own sentence, the clause the rubric checks read. Count rows skip the restatement, whose
    numbers would satisfy every count rubric.
    """
    measured = {
        "pitch": lambda: f"First tone {params['f1_hz']:.0f} Hz, second tone {params['f2_hz']:.0f} Hz.",
        "loudness": lambda: "First half {:.0f} dB, second half {:.0f} dB.".format(
            *(20 * np.log10(params[k]) for k in ("amp_first", "amp_second"))),
        "tempo": lambda: (f"First pattern {params['rate_first']:.1f} clicks a second, second pattern "
                          f"{params['rate_second']:.1f} clicks a second."),
        "duration": lambda: f"First tone {params['first_s']:.2f} s, second tone {params['second_s']:.2f} s.",
    }
    if family not in measured:                        # count: "I hear 3 beeps" names the count
        return f"{verdict.rstrip('.')}, so {letter}."
    options = ", ".join(f"{chr(65 + k)} is {c}" for k, c in enumerate(choices))
    return f"{options}. {measured[family]()} {verdict.rstrip('.')}, so {letter}."


GENERATORS: dict[str, Callable[..., dict[str, Any]]] = {
    "count": _count, "pitch": _pitch, "loudness": _loudness, "tempo": _tempo, "duration": _duration}


def make_item(family: str, rng: random.Random, cell: Any, clip_s: float = 2.0) -> dict[str, Any]:
    """One clip and its question: {wave, question, choices, gold (option text), verdict, params}."""
    if family not in GENERATORS:
        raise ValueError(f"unknown tones family {family!r}; known: {list(FAMILIES)}")
    nrng = np.random.default_rng(rng.randrange(2 ** 32))
    item = GENERATORS[family](rng, nrng, clip_s, cell)
    noise = nrng.normal(0.0, rng.uniform(0.001, 0.004), len(item["wave"]))
    item["wave"] = np.clip(item["wave"] + noise, -1, 1).astype(np.float32)
    order = list(range(len(item["choices"])))
    rng.shuffle(order)
    item["choices"] = [item["choices"][k] for k in order]
    return item


def _example(item: dict[str, Any], family: str, ex_id: str, audio_rel: str, audio_abs: Path) -> Example:
    import soundfile as sf

    from mmrlvr.methods.audio_rubrics.evidence import evidence_for, static_rubrics

    audio_abs.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(audio_abs), item["wave"], SR, subtype="PCM_16")
    evidence = [evidence_for(audio_abs)]          # measured from the file as written
    letter = chr(65 + item["choices"].index(item["gold"]))
    prompt = with_options(item["question"], item["choices"])
    reasoning = reference_reasoning(family, item["params"], item["verdict"], item["choices"], letter)
    return Example(id=ex_id, prompt=prompt, answer=letter, audios=[audio_rel],
                   choices=item["choices"], reasoning=reasoning,
                   meta={"family": family, "source": "tones", "answer_type": "closed",
                         "params": item["params"], "evidence": evidence,
                         "rubrics": static_rubrics(evidence, item["question"])})


def _split(out_dir: Path, split: str, n: int, rng: random.Random, families: list[str],
           clip_s: float) -> tuple[list[Example], dict[str, int]]:
    counts = {f: n // len(families) + (k < n % len(families)) for k, f in enumerate(families)}
    order = []
    for f in families:
        cells = ANSWER_CELLS[f]
        offset = rng.randrange(len(cells))
        picks = [cells[(offset + j) % len(cells)] for j in range(counts[f])]
        order += [(f, c) for c in picks]
    rng.shuffle(order)
    examples = []
    for i, (family, cell) in enumerate(order):
        ex_id = f"{split}-{i:05d}"
        rel = f"audio/{ex_id}.wav"
        examples.append(_example(make_item(family, rng, cell, clip_s), family, ex_id, rel,
                                 out_dir / rel))
    return examples, counts


def write_rows(examples: list[Example], path: Path) -> None:
    """JSONL with audio paths exactly as the examples hold them (relative to the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for ex in examples:
            fh.write(json.dumps(ex.to_json(), ensure_ascii=False) + "\n")


DURATION_CLIP_S = 1.8
"""The shortest clip the 'duration' family's two tones and their gap fit in."""


def make_tones(out_dir: str | Path, *, n_train: int = 2000, n_test: int = 200, seed: int = 0,
               families: list[str] | None = None, clip_s: float = 2.0) -> dict[str, Any]:
    """Write a tones dataset to `out_dir`; returns its info dict (also saved as info.json)."""
    out_dir = Path(out_dir)
    families = list(dict.fromkeys(families or FAMILIES))
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown tones families {unknown}; known: {list(FAMILIES)}")
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train}, {n_test}")
    if not 1.0 <= clip_s <= 30.0:
        raise ValueError(f"clip_s must lie in [1, 30] seconds, got {clip_s}")
    if "duration" in families and clip_s < DURATION_CLIP_S:
        # its two tones and the gap between them last up to 0.1 + 0.35 + 0.4 + 0.91 s
        raise ValueError(f"clip_s {clip_s} is too short for the 'duration' family (two tones and a "
                         f"gap need {DURATION_CLIP_S} s); give clip_s >= {DURATION_CLIP_S} or "
                         "leave 'duration' out of families")
    train, train_counts = _split(out_dir, "train", n_train, random.Random(f"tones-train-{seed}"),
                                 families, clip_s)
    test, test_counts = _split(out_dir, "test", n_test, random.Random(f"tones-test-{seed}"),
                               families, clip_s)
    write_rows(train, out_dir / "train.jsonl")
    write_rows(test, out_dir / "test.jsonl")
    info = {"task": "tones", "seed": seed, "sample_rate": SR, "clip_s": clip_s,
            "families": families, "n_train": n_train, "n_test": n_test,
            "counts": {"train": train_counts, "test": test_counts},
            "files": {"train": "train.jsonl", "test": "test.jsonl", "audio": "audio"}}
    (out_dir / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


# -- public layouts ----------------------------------------------------------------------------
def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        rows = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}, row {n}: invalid JSON ({err.msg})") from None
        return rows


def _audio_path(path: Path, value: str, where: str) -> str:
    audio = Path(value)
    audio = audio if audio.is_absolute() else (path.parent / audio)
    if not audio.is_file():
        raise DataError(f"{where}: audio not found: {audio}")
    return str(audio.resolve())


def mmau_row(row: dict[str, Any], *, path: Path, line: int) -> Example:
    """MMAU / MMAR: `id`, `audio_id` (relative to the JSON), `question`, `choices`, `answer` (the
    option's text); `task`, `category`, `sub-category`, `difficulty` go to `meta`."""
    where = f"{path}, row {line}"
    for key in ("question", "choices", "answer", "audio_id"):
        if not row.get(key):
            raise DataError(f"{where}: missing field '{key}' (have: {sorted(row)})")
    choices = [str(c) for c in row["choices"]]
    answer = str(row["answer"]).strip()
    folded = [c.strip().casefold() for c in choices]
    if answer.casefold() not in folded:
        raise DataError(f"{where}: answer {answer!r} is not one of the choices {choices}")
    meta = {k: row[k] for k in ("task", "category", "sub-category", "difficulty", "dataset") if k in row}
    return Example(id=str(row.get("id") or f"mmau-{line}"),
                   prompt=with_options(str(row["question"]).strip(), choices),
                   answer=chr(65 + folded.index(answer.casefold())), choices=choices,
                   audios=[_audio_path(path, row["audio_id"], where)],
                   meta={"source": "mmau", "family": str(row.get("task", "mmau")),
                         "answer_type": "closed", **meta})


def avqa_row(row: dict[str, Any], *, path: Path, line: int, audio_dir: Path | None = None) -> Example:
    """AVQA (R1-AQA's JSONL): `question_text`, `multi_choice`, `answer` (index into the choices),
    `audio_path`; without `audio_path`, `audio_dir/<video_name>.wav`."""
    where = f"{path}, row {line}"
    for key in ("question_text", "multi_choice", "answer"):
        if row.get(key) is None or row.get(key) == "":
            raise DataError(f"{where}: missing field '{key}' (have: {sorted(row)})")
    choices = [str(c) for c in row["multi_choice"]]
    index = int(row["answer"])
    if not 0 <= index < len(choices):
        raise DataError(f"{where}: answer index {index} outside the {len(choices)} choices")
    if row.get("audio_path"):
        audio = _audio_path(path, row["audio_path"], where)
    elif row.get("video_name") and audio_dir is not None:
        audio = _audio_path(path, str(Path(audio_dir) / f"{row['video_name']}.wav"), where)
    else:
        raise DataError(f"{where}: no 'audio_path' (and no video_name with an audio dir)")
    meta = {k: row[k] for k in ("question_type", "question_relation", "video_name") if k in row}
    return Example(id=f"avqa-{row.get('id', line)}",
                   prompt=with_options(str(row["question_text"]).strip(), choices),
                   answer=chr(65 + index), choices=choices, audios=[audio],
                   meta={"source": "avqa", "family": str(row.get("question_type", "avqa")),
                         "answer_type": "closed", **meta})


LAYOUTS = {"mmau": mmau_row, "avqa": avqa_row}


def load_layout(spec: str, *, on_error: str = "raise", audio_dir: str | None = None) -> list[Example]:
    """`mmau:FILE.json` or `avqa:FILE.json[l]` as Examples (absolute audio paths)."""
    layout, _, file = spec.partition(":")
    if layout not in LAYOUTS or not file:
        raise DataError(f"audio layout spec must be mmau:FILE or avqa:FILE, got {spec!r}")
    path = Path(file)
    out = []
    for line, row in enumerate(_rows(path), start=1):
        try:
            if not isinstance(row, dict):
                raise DataError(f"{path}, row {line}: expected a JSON object")
            kwargs = {"audio_dir": Path(audio_dir)} if layout == "avqa" and audio_dir else {}
            out.append(LAYOUTS[layout](row, path=path, line=line, **kwargs))
        except DataError:
            if on_error == "raise":
                raise
    if not out:
        raise DataError(f"{spec}: no usable rows")
    return out


def convert(spec: str, out_dir: str | Path, *, evidence: bool = True, on_error: str = "raise",
            audio_dir: str | None = None) -> dict[str, Any]:
    """Write `spec`'s rows as `out_dir/<file stem>.jsonl` with evidence and static rubrics in `meta`."""
    from mmrlvr.methods.audio_rubrics.evidence import evidence_for, static_rubrics

    examples = load_layout(spec, on_error=on_error, audio_dir=audio_dir)
    if evidence:
        for ex in examples:
            ev = [evidence_for(a) for a in ex.audios]
            ex.meta.update(evidence=ev, rubrics=static_rubrics(ev, ex.prompt))
    out = Path(out_dir) / f"{Path(spec.partition(':')[2]).stem}.jsonl"
    write_jsonl(examples, out, copy_media_to="audio")      # self-contained: clips copied beside it
    info = {"task": "tones-convert", "from": spec, "rows": len(examples), "file": str(out)}
    (Path(out_dir) / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


TASK = Task(
    "MMAU-style audio multiple choice: beeps, pitch, loudness, tempo, duration (audio)",
    lambda out, o: make_tones(out, n_train=o.n_train, n_test=o.n_test, seed=o.seed,
                              families=o.families),
    lambda spec, out: convert(spec, out), ("mmau", "avqa"))
