#!/usr/bin/env bash
# The CPU quickstart: a tiny Qwen2.5-VL learns the shapes task.
#   tiny model -> synthetic data -> SFT warm start -> GRPO -> held-out accuracy before/after.
# Everything is built locally; nothing is downloaded except the Python packages.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
MM=.venv/bin/mmrlvr
CFG=configs/quickstart.yaml
$MM data shapes --out runs/shapes --families kind,count --n-train 2000 --n-test 300 --seed 0 > /dev/null
$MM tiny qwen2.5-vl --out runs/tiny-qwen25vl --corpus runs/shapes/train.jsonl
$MM sft $CFG --overwrite "$@"
$MM train $CFG --overwrite "$@"
.venv/bin/python - <<'PY'
import json
s = json.load(open("runs/quickstart/summary.json"))
print(f"\nheld-out accuracy (greedy, {s['eval_rows']} questions): "
      f"{s['accuracy_start']:.3f} after SFT -> {s['accuracy_end']:.3f} after GRPO "
      f"({100 * s['accuracy_gain']:+.1f} points). Report: runs/quickstart/report.md")
PY
