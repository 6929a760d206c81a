#!/usr/bin/env bash
# Methods against plain GRPO on the CPU quickstart task: several seeds each, equal steps, one
# paired comparison at the end (held-out accuracy, pass@k, mean ± 95 % interval over seeds,
# paired bootstrap and McNemar against the first arm).
#
#   bash bench/method_compare.sh [--steps 200] [--seeds "0 1 2"] [--out runs/cmp] [--threads 1] \
#        plain=configs/quickstart.yaml gapo=configs/shapes_gapo_cpu.yaml ...
#
# An arm is NAME=CONFIG[|key=value|...]: overrides after the config switch one method off for a
# baseline at otherwise equal settings ("plain=configs/shapes_ncgrpo_cpu.yaml|rollout.branching.kind=none").
# The first arm is the baseline. Every run starts from its config's model.path (the quickstart
# configs: from the quickstart's SFT model and data; run `bash scripts/quickstart.sh` once first).
# Runs go to OUT/NAME-sSEED; a run that already has a summary.json is kept (so an interrupted
# comparison resumes where it stopped). The table is printed and saved as OUT/compare.md
# (+ compare.json, compare.png).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=200; SEEDS="0 1 2"; OUT=runs/cmp; THREADS=1; SAMPLES=4
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --steps) STEPS=$2; shift 2;; --seeds) SEEDS=$2; shift 2;; --out) OUT=$2; shift 2;;
    --threads) THREADS=$2; shift 2;; --samples) SAMPLES=$2; shift 2;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2;;
  esac
done
[[ $# -ge 2 ]] || { echo "usage: $0 [options] NAME=CONFIG NAME=CONFIG ... (first = baseline)" >&2; exit 2; }
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
MM=.venv/bin/mmrlvr
mkdir -p "$OUT"
for seed in $SEEDS; do
  for arm in "$@"; do
    name=${arm%%=*}; spec=${arm#*=}; IFS="|" read -r -a parts <<< "$spec"
    cfg=${parts[0]}; overrides=("${parts[@]:1}"); dir=$OUT/$name-s$seed
    [[ -f $dir/summary.json ]] && continue
    echo "== $name seed $seed ($spec, $STEPS steps) -> $dir"
    $MM train "$cfg" "${overrides[@]}" train.seed=$seed train.steps=$STEPS train.eval_every=$STEPS train.save_every=0 \
        train.eval_samples=$SAMPLES train.out_dir=$dir --overwrite > "$OUT/$name-s$seed.log" 2>&1 \
      || { echo "   failed: see $OUT/$name-s$seed.log" >&2; exit 1; }
    tail -1 "$OUT/$name-s$seed.log"
  done
done
ARGS=()
for arm in "$@"; do
  name=${arm%%=*}; runs=()
  for seed in $SEEDS; do runs+=("$OUT/$name-s$seed"); done
  ARGS+=(--arm "$name=$(IFS=,; echo "${runs[*]}")")
done
$MM compare "${ARGS[@]}" --json "$OUT/compare.json" --plot "$OUT/compare.png" | tee "$OUT/compare.md"
