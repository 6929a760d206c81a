"""Every CPU method config on a shortened chain, for "this change moved no number" checks.

    python bench/method_chain.py run --out /tmp/chain-before      # at the old commit
    python bench/method_chain.py run --out /tmp/chain-after       # at the new one
    python bench/method_chain.py compare /tmp/chain-before /tmp/chain-after

`run` builds, under OUT, tiny models and small synthetic sets (shapes with its OOD split,
medvqa, tones, banners), a short supervised warm start per task (so groups have reward
spread), then every `configs/*_cpu.yaml` and the quickstart for a few GRPO steps (eval at the
end on a few rows), each with the same seed, one thread. `compare` checks that each run's
metrics rows are identical (every key but wall-clock times, in seconds, and throughputs) and prints the
first difference of any that are not. A refactor that keeps every method's path exact prints
"identical" for every config.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMING = ("time/", "perf/")
"""Wall-clock keys (and every key ending in `_s`, seconds): they differ run to run."""

TASKS = {
    # task: (data command, tiny kind, corpus, sft config); all sizes small
    "shapes": (["data", "shapes", "--families", "kind,count", "--n-train", "200", "--n-test",
                "24", "--seed", "0", "--ood"], "qwen2.5-vl", "configs/quickstart.yaml"),
    "medvqa": (["data", "medvqa", "--n-train", "200", "--n-test", "24"], "qwen2.5-vl",
               "configs/medvqa_grpo_cpu.yaml"),
    "tones": (["data", "tones", "--n-train", "120", "--n-test", "16"], "qwen2-audio",
              "configs/tones_cpu.yaml"),
    "banners": (["data", "banners", "--families", "en-de", "--n-train", "120", "--n-test", "8"],
                "qwen2.5-vl", "configs/banners_cpu.yaml"),
}
CONFIG_TASK = {"shapes": "shapes", "quickstart": "shapes", "medvqa": "medvqa", "tones": "tones",
               "banners": "banners"}


def mmrlvr(*args: str, log: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "mmrlvr.cli", *args]
    with log.open("a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(args[:3])} (see {log})")


def prepare(out: Path, task: str, log: Path) -> dict[str, str]:
    """The task's data, tiny model and short warm start under OUT (kept if there)."""
    data_args, kind, sft_config = TASKS[task]
    data, tiny, sft = out / "data" / task, out / "tiny" / task, out / "sft" / task
    if not (data / "train.jsonl").exists():
        mmrlvr(*data_args, "--out", str(data), log=log)
    if not (tiny / "config.json").exists():
        mmrlvr("tiny", kind, "--out", str(tiny), "--corpus", str(data / "train.jsonl"), log=log)
    if not (sft / "final" / "config.json").exists():
        mmrlvr("sft", sft_config, f"sft.init={tiny}", f"sft.out_dir={sft}", "sft.steps=20",
               f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'test.jsonl'}",
               "--overwrite", log=log)
    return {"model": str(sft / "final"), "data": str(data)}


def task_of(config: Path) -> str | None:
    return next((t for prefix, t in CONFIG_TASK.items() if config.stem.startswith(prefix)), None)


def run(out: Path, steps: int, only: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "chain.log"
    configs = sorted(ROOT.glob("configs/*_cpu.yaml")) + [ROOT / "configs/quickstart.yaml"]
    for config in configs:
        if only and config.stem not in only:
            continue
        if (out / "runs" / config.stem / "summary.json").exists():
            continue                            # done in an earlier call: resume where it stopped
        task = task_of(config)
        if task is None:
            print(f"== {config.stem}: no task data for it here, skipped", flush=True)
            continue
        made = prepare(out, task, log)
        run_dir = out / "runs" / config.stem
        evals = f"data.eval={made['data']}/test.jsonl"
        if config.stem == "shapes_ncgrpo_cpu":
            evals = (f"data.eval={{in: {made['data']}/test.jsonl, "
                     f"ood: {made['data']}/test_ood.jsonl}}")
        extra = []
        if config.stem == "shapes_opdvr_cpu":      # its teacher: the task's warm-start model here
            extra = [f"algo.shaping=[{{name: opdvr, teacher: {made['model']}, coef: 0.1, "
                     "correct_threshold: 0.5}]"]
        print(f"== {config.stem}", flush=True)
        mmrlvr("train", str(config.relative_to(ROOT)), f"model.path={made['model']}",
               f"data.train={made['data']}/train.jsonl", evals, f"train.steps={steps}",
               "train.batch_prompts=4", f"train.eval_every={steps}", "train.save_every=0",
               "data.eval_limit=8", "train.seed=0", f"train.out_dir={run_dir}", *extra,
               "--overwrite", log=log)


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items()
             if not k.startswith(TIMING) and not k.endswith("_s")}
            for line in lines if line.strip()]


def compare(a: Path, b: Path) -> int:
    bad = 0
    for run_dir in sorted((a / "runs").iterdir()):
        other = b / "runs" / run_dir.name
        if not (other / "metrics.jsonl").exists():
            print(f"{run_dir.name}: missing in {b}")
            bad += 1
            continue
        mine, theirs = rows(run_dir), rows(other)
        diff = next(((i, k, r.get(k), s.get(k)) for i, (r, s) in enumerate(zip(mine, theirs))
                     for k in sorted(set(r) | set(s)) if r.get(k) != s.get(k)), None)
        if diff is None and len(mine) == len(theirs):
            print(f"{run_dir.name}: identical ({len(mine)} rows, {len(mine[-1])} keys in the last)")
        else:
            bad += 1
            print(f"{run_dir.name}: DIFFERS" + (f" at row {diff[0]}, {diff[1]}: {diff[2]} vs {diff[3]}"
                                               if diff else f" in row count {len(mine)} vs {len(theirs)}"))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run every CPU method config for a few steps")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--steps", type=int, default=3)
    r.add_argument("--only", nargs="*", default=[], help="config stems to run (default: all)")
    c = sub.add_parser("compare", help="are two chains' metrics identical?")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.out, args.steps, args.only)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
