"""The answering half of `mmrlvr stress`: greedy completions of (prompt, format) jobs in batches,
and one scored record per answer, shared by the fixed operators (`run`) and dynamic draws
(`dynamic`)."""
from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

from mmrlvr.core.prompting import Prompting
from mmrlvr.data import Example
from mmrlvr.rollout.base import SamplingParams
from rewards.verify import detect_kind, extract_answer, match

SUBSETS = ("all", "closed", "open")


def answer_type(ex: Example) -> str:
    """`closed` or `open`: `meta.answer_type` when present, else from the gold's kind."""
    given = str(ex.meta.get("answer_type", "")).lower()
    if given in ("closed", "open"):
        return given
    return "closed" if ex.choices or detect_kind(ex.answer) in ("yesno", "choice") else "open"


def answer(policy, engine, jobs: list[tuple], *, system_prompt: str = "", batch_size: int = 32,
           max_new_tokens: int = 64, progress: bool = True, desc: str = "stress"
           ) -> list[tuple[tuple, str]]:
    """Greedy completions of jobs `(name, row, example, format prompt, ...)`, batched with one
    format instruction per batch: [(job, completion)] in that batched order."""
    jobs = sorted(jobs, key=lambda j: j[3])
    out: list[tuple[tuple, str]] = []
    bar = tqdm(total=len(jobs), desc=desc, disable=not progress)
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start:start + batch_size]
        groups: dict[str, list] = {}
        for job in chunk:
            groups.setdefault(job[3], []).append(job)
        for fmt, part in groups.items():
            batch = Prompting(system_prompt, fmt).encode(policy, [j[2] for j in part])
            done = engine.generate(batch, SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
            out.extend(zip(part, done.texts))
        bar.update(len(chunk))
    bar.close()
    return out


def record(name: str, kind: str, row: int, ex: Example, clean: Example, fmt: str, text: str
           ) -> dict[str, Any]:
    """One answer as the report keeps it, scored as training and eval score it."""
    pred = extract_answer(text)
    return {"op": name, "kind": kind, "row": row, "id": ex.id, "answer_type": answer_type(clean),
            "prompt": ex.prompt, "format_prompt": fmt, "gold": ex.answer, "choices": ex.choices,
            "completion": text, "extracted": pred,
            "correct": bool(pred is not None and match(pred, ex.answer, ex.choices))}
