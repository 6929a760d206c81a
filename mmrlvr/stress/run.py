"""`mmrlvr stress`: how much a model's accuracy moves under meaning-preserving prompt and image changes.

Every example is answered greedily once clean and once per operator that applies to it
(`mmrlvr.stress.ops`), in batches through the `hf` rollout engine; correctness is
`rewards.verify.match(extract_answer(completion), gold, choices)`, as in training and eval.
Per operator, on the rows it applies to and paired with the same rows' clean answers:

    accuracy, drop = clean accuracy - operator accuracy (points; positive = worse), a 95%
    paired bootstrap interval of the drop, McNemar's exact p-value (two-sided binomial test on
    the discordant pairs) and the flip rate (rows whose correctness changed).

Each figure is given for all rows and, kept apart, for closed (yes/no, multiple choice) and open
questions, grouped by the clean question's `meta.answer_type` (else: closed when the gold is
yes/no or a choice). Text operators' mean drop is the robustness figure; image, audio, video and
task-altering operators are reported separately. `--out` gets `report.json` (settings, every
figure and every raw prediction, from which `summarize` recomputes all figures), `report.md`
and `stress.png`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from mmrlvr.data import Example
from mmrlvr.stress import OPERATORS, apply
from mmrlvr.stress.ops_video import operators as video_operators
from mmrlvr.core.templates import HELDOUT_TEMPLATES
from mmrlvr.core.stats import mcnemar_exact
from mmrlvr.stress.answers import SUBSETS, answer, answer_type, record  # noqa: F401 (answer_type: API)
from mmrlvr.stress.dynamic import report_lines as dynamic_lines, run_dynamic, summarize_dynamic

KINDS = ("text", "image", "audio", "video", "task")


def find_run_config(model: str | Path) -> tuple[Path, dict[str, Any]]:
    """(model dir to load, the training run's config as a dict or {}) for a run dir or model dir.

    A run dir (`config.yaml` + `final/`) loads `final/`; a model dir inside a run dir
    (`final/`, `checkpoints/step-N/`) finds the run's config.yaml one or two levels up.
    """
    path = Path(model)
    if (path / "config.yaml").is_file() and (path / "final").is_dir():
        return path / "final", yaml.safe_load((path / "config.yaml").read_text()) or {}
    for parent in ((path.parent, path.parent.parent) if path.is_dir() else ()):
        if (parent / "config.yaml").is_file():
            return path, yaml.safe_load((parent / "config.yaml").read_text()) or {}
    return path, {}


def run_stress(policy, engine, examples: list[Example], ops: list[str], *, format_prompt: str = "",
               system_prompt: str = "", batch_size: int = 32, max_new_tokens: int = 64, seed: int = 0,
               progress: bool = True) -> list[dict[str, Any]]:
    """Answer the clean set and every applicable operator variant; one record per answer."""
    unknown = [o for o in ops if o not in OPERATORS]
    if unknown:
        raise ValueError(f"unknown stress operators {unknown}; known: {list(OPERATORS)}")
    jobs = []   # (op name, row, example, format prompt)
    for row, ex in enumerate(examples):
        jobs.append(("clean", row, ex, format_prompt))
        for name in ops:
            v = apply(OPERATORS[name], ex, format_prompt, seed)
            if v is not None:
                jobs.append((name, row, v.example, v.format_prompt))
    records: list[dict[str, Any]] = []
    for (name, row, ex, fmt), text in answer(policy, engine, jobs, system_prompt=system_prompt,
                                             batch_size=batch_size, max_new_tokens=max_new_tokens,
                                             progress=progress):
        records.append(record(name, "clean" if name == "clean" else OPERATORS[name].kind, row, ex,
                              examples[row], fmt, text))
    records.sort(key=lambda r: (r["row"], -1 if r["op"] == "clean" else list(OPERATORS).index(r["op"])))
    return records


def paired_metrics(clean: list[bool], other: list[bool], n_boot: int = 1000, seed: int = 0
                   ) -> dict[str, Any]:
    """Accuracy, drop (points), its 95% paired bootstrap interval, McNemar p and flip rate."""
    n = len(clean)
    if n == 0:
        return {"n": 0}
    c, o = np.asarray(clean, dtype=float), np.asarray(other, dtype=float)
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))        # [B, n]
    drops = 100 * (c[idx].mean(axis=1) - o[idx].mean(axis=1))                 # [B]
    b = int(((c == 1) & (o == 0)).sum())                                      # clean right, op wrong
    w = int(((c == 0) & (o == 1)).sum())                                      # clean wrong, op right
    return {"n": n, "clean_accuracy": float(c.mean()), "accuracy": float(o.mean()),
            "drop": float(100 * (c.mean() - o.mean())),
            "drop_ci95": [float(np.percentile(drops, 2.5)), float(np.percentile(drops, 97.5))],
            "mcnemar_p": mcnemar_exact(b, w), "broke": b, "fixed": w, "flip_rate": (b + w) / n}


def summarize(records: list[dict[str, Any]], ops: list[str], n_boot: int = 1000, seed: int = 0
              ) -> dict[str, Any]:
    """Every figure of the report, from the raw records alone."""
    clean = {r["row"]: r for r in records if r["op"] == "clean"}
    out: dict[str, Any] = {"clean": {}, "ops": {}, "groups": {}}
    for subset in SUBSETS:
        rows = [r for r in clean.values() if subset == "all" or r["answer_type"] == subset]
        out["clean"][subset] = {"n": len(rows),
                                "accuracy": float(np.mean([r["correct"] for r in rows])) if rows else None}
    for name in ops:
        mine = [r for r in records if r["op"] == name]
        entry: dict[str, Any] = {"kind": OPERATORS[name].kind, "doc": OPERATORS[name].doc,
                                 "applied": len(mine)}
        for subset in SUBSETS:
            pick = [r for r in mine if subset == "all" or r["answer_type"] == subset]
            entry[subset] = paired_metrics([clean[r["row"]]["correct"] for r in pick],
                                           [r["correct"] for r in pick], n_boot, seed)
        out["ops"][name] = entry
    for kind in KINDS:
        for subset in SUBSETS:
            drops = [e[subset]["drop"] for e in out["ops"].values()
                     if e["kind"] == kind and e[subset]["n"]]
            out["groups"].setdefault(kind, {})[subset] = float(np.mean(drops)) if drops else None
    return out


def _fmt(x, spec=".1f"):
    return "–" if x is None else format(x, spec)


def write_report(out_dir: str | Path, report: dict[str, Any]) -> Path:
    """`report.json` (figures + raw predictions), `report.md` and `stress.png` under `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    figs = report["summary"]
    lines = [f"# Stress test: {report['settings']['model']}", "",
             f"Data: `{report['settings']['data']}` ({figs['clean']['all']['n']} questions). "
             "Greedy answers; drop = clean accuracy − operator accuracy in points (positive = "
             "worse), on the rows each operator applies to; 95% paired bootstrap interval; "
             "McNemar exact p; flips = rows whose correctness changed.", "",
             "| clean | all | closed | open |", "|---|---|---|---|",
             "| accuracy | " + " | ".join(_fmt(figs["clean"][s]["accuracy"], ".3f") for s in SUBSETS) + " |",
             "| n | " + " | ".join(str(figs["clean"][s]["n"]) for s in SUBSETS) + " |", ""]
    titles = {"text": "Prompt operators (robustness figure)", "image": "Image operators",
              "audio": "Audio operators", "video": "Video operators",
              "task": "Task-altering operators (not part of the robustness figure)"}
    for kind in KINDS:
        names = [n for n, e in figs["ops"].items() if e["kind"] == kind]
        if not names:
            continue
        mean = figs["groups"][kind]
        lines += [f"## {titles[kind]}", "",
                  "Mean drop: " + ", ".join(f"{s} {_fmt(mean[s])}" for s in SUBSETS) + " points.", "",
                  "| operator | subset | n | clean | accuracy | drop [95% CI] | McNemar p | flips |",
                  "|---|---|---|---|---|---|---|---|"]
        for name in names:
            for s in SUBSETS:
                m = figs["ops"][name][s]
                if not m["n"]:
                    continue
                lo, hi = m["drop_ci95"]
                lines.append(f"| {name} | {s} | {m['n']} | {m['clean_accuracy']:.3f} | "
                             f"{m['accuracy']:.3f} | {m['drop']:+.1f} [{lo:+.1f}, {hi:+.1f}] | "
                             f"{m['mcnemar_p']:.3g} | {m['flip_rate']:.3f} |")
        lines.append("")
    if "dynamic" in report:
        lines += dynamic_lines(report["dynamic"])
    lines += ["![drops](stress.png)", "", "Operators: " + "; ".join(
        f"`{n}` {e['doc']}" for n, e in figs["ops"].items()) + "."]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    _chart(figs, out_dir / "stress.png")
    return out_dir


def _chart(figs: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(figs["ops"])
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(len(names), 1)))
    colors = {"closed": "tab:blue", "open": "tab:orange"}
    for k, subset in enumerate(("closed", "open")):
        ys, xs, errs = [], [], [[], []]
        for i, name in enumerate(names):
            m = figs["ops"][name][subset]
            if m["n"]:
                ys.append(i + (k - 0.5) * 0.38)
                xs.append(m["drop"])
                errs[0].append(m["drop"] - m["drop_ci95"][0])
                errs[1].append(m["drop_ci95"][1] - m["drop"])
        ax.barh(ys, xs, height=0.36, xerr=errs if xs else None, color=colors[subset],
                label=subset, capsize=2)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([f"{n} ({figs['ops'][n]['kind']})" for n in names])
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("accuracy drop vs clean (points, 95% CI)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stress(model: str, data: str, out: str, ops: list[str] | None = None, *, modality: str | None = None,
           format_prompt: str | None = None, system_prompt: str | None = None, limit: int = 0,
           batch_size: int = 32, max_new_tokens: int = 64, seed: int = 0, n_boot: int = 1000,
           device: str = "auto", min_pixels: int | None = None, max_pixels: int | None = None,
           progress: bool = True, dynamic: int = 0) -> dict[str, Any]:
    """Load a model (run dir, model dir or hub id) and a dataset, stress it, write the report;
    `dynamic` K > 0 adds K freshly drawn wordings of every question (mmrlvr/stress/dynamic.py)."""
    import modalities
    from mmrlvr.config import ConfigError, ModelConfig
    from mmrlvr.tasks.medvqa_public import load_any
    from mmrlvr.core.prompting import Prompting
    from mmrlvr.train.lengths import eval_budget, refuse_long
    from mmrlvr.train.policy import Policy, pick_device
    from mmrlvr.rollout import make_engine

    model_dir, run_cfg = find_run_config(model)
    rc_model, rc_data = run_cfg.get("model", {}) or {}, run_cfg.get("data", {}) or {}
    mcfg = ModelConfig(path=str(model_dir), modality=modality or rc_model.get("modality", "vision"),
                       min_pixels=min_pixels or rc_model.get("min_pixels", 56 * 56),
                       max_pixels=max_pixels or rc_model.get("max_pixels", 112 * 112))
    fmt = format_prompt if format_prompt is not None else rc_data.get("format_prompt", "")
    system = system_prompt if system_prompt is not None else rc_data.get("system_prompt", "")
    skip = "image" if mcfg.modality == "audio" else "audio"     # media the data cannot have
    chosen = list(ops or [n for n, op in OPERATORS.items() if op.kind != skip])
    unknown = [o for o in chosen if o not in OPERATORS]
    if unknown:
        raise ConfigError(f"unknown stress operators {unknown}; known: {list(OPERATORS)}")
    examples = load_any(data)
    if limit:
        examples = examples[:limit]
    if not ops and not any(ex.videos for ex in examples):      # the default set: no video ops
        chosen = [n for n in chosen if n not in video_operators()]
    ops = chosen
    # the clean prompts against the model's context, before the weights load (an operator's
    # added words are not measured: they are a few tokens beside the question)
    refuse_long(examples, eval_budget(mcfg, max_new_tokens, Prompting(system, fmt)), str(data))
    adapter = modalities.get(mcfg.modality, min_pixels=mcfg.min_pixels, max_pixels=mcfg.max_pixels)
    policy = Policy.load(mcfg, adapter, pick_device(device))
    records = run_stress(policy, make_engine("hf", policy), examples, ops, format_prompt=fmt,
                         system_prompt=system, batch_size=batch_size, max_new_tokens=max_new_tokens,
                         seed=seed, progress=progress)
    trained = list(rc_data.get("templates") or [])
    report = {"settings": {"model": str(model), "model_dir": str(model_dir), "data": str(data),
                           "ops": ops, "format_prompt": fmt, "system_prompt": system, "seed": seed,
                           "n_boot": n_boot, "max_new_tokens": max_new_tokens,
                           "trained_templates": trained,
                           "heldout_overlap": sorted(set(trained) & set(HELDOUT_TEMPLATES))},
              "summary": summarize(records, ops, n_boot, seed), "predictions": records}
    if dynamic:
        drawn = run_dynamic(policy, make_engine("hf", policy), examples, dynamic,
                            format_prompt=fmt, system_prompt=system, batch_size=batch_size,
                            max_new_tokens=max_new_tokens, seed=seed, progress=progress)
        clean = {r["row"]: r for r in records if r["op"] == "clean"}
        report["settings"]["dynamic"] = dynamic
        report["dynamic"] = summarize_dynamic(drawn, clean, n_boot, seed)
        report["dynamic_predictions"] = drawn
    write_report(out, report)
    return report
