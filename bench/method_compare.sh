#!/usr/bin/env bash
# Methods against plain GRPO on the CPU quickstart task: several seeds each, equal steps, one
# paired comparison at the end (held-out accuracy, pass@k, mean ± 95 % interval over seeds,
# paired bootstrap and McNemar against the first arm, run-level interval, Welch p and verdict).
#
#   bash bench/method_compare.sh [--steps 200] [--seeds "0 1 2"] [--out runs/cmp] [--threads 1] \
#        [--jobs 1] [--check ARM=METHOD ...] [--controls] [--weaken KEY=VALUE] [--train-inactive] [--dry-run] \
#        plain=configs/quickstart.yaml gapo=configs/shapes_gapo_cpu.yaml ...
#
# An arm is NAME=CONFIG[|key=value|...]: overrides after the config switch one method off for a
# baseline at otherwise equal settings ("plain=configs/shapes_ncgrpo_cpu.yaml|rollout.branching.kind=none").
# The first arm is the baseline. Every run starts from its config's model.path (the quickstart
# configs: from the quickstart's SFT model and data; run `bash scripts/quickstart.sh` once first).
#
# Mechanism checks come before outcomes: `--check ARM=METHOD` runs `mmrlvr check-method METHOD`
# on the arm's config (and overrides) before any arm trains; an arm whose mechanism is inactive is
# not trained (unless --train-inactive) and the table says so rather than comparing it.
# `--controls` adds two arms that show the harness's own sensitivity: a positive control
# (`control-weak`: the baseline with --weaken applied, optim.lr=1e-6 unless given, which should
# come out worse) and a placebo (`control-placebo`: the baseline itself on other seeds, seed+1000,
# which should show no effect).
# Runs go to OUT/NAME-sSEED; a run that already has a summary.json is kept (so an interrupted
# comparison resumes where it stopped), and so is a check that already has its OUT/checks/ARM.json
# (delete it to check again). `--jobs N` trains N runs at a time (each with --threads threads);
# each run's wall time, eval included, goes to OUT/NAME-sSEED.wall (seconds). The table is printed and saved as OUT/compare.md
# (+ compare.json, compare.png). --dry-run prints what would run and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=200; SEEDS="0 1 2"; OUT=runs/cmp; THREADS=1; SAMPLES=4
CHECKS=(); CONTROLS=0; WEAKEN="optim.lr=1e-6"; TRAIN_INACTIVE=0; DRY=0; JOBS=1
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --steps) STEPS=$2; shift 2;; --seeds) SEEDS=$2; shift 2;; --out) OUT=$2; shift 2;;
    --threads) THREADS=$2; shift 2;; --samples) SAMPLES=$2; shift 2;; --jobs) JOBS=$2; shift 2;;
    --check) CHECKS+=("$2"); shift 2;; --controls) CONTROLS=1; shift;;
    --weaken) WEAKEN=$2; shift 2;; --train-inactive) TRAIN_INACTIVE=1; shift;;
    --dry-run) DRY=1; shift;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2;;
  esac
done
[[ $# -ge 1 ]] || { echo "usage: $0 [options] NAME=CONFIG NAME=CONFIG ... (first = baseline)" >&2; exit 2; }
ARMS=("$@")
if [[ $CONTROLS == 1 ]]; then
  base=${ARMS[0]#*=}
  ARMS+=("control-weak=$base|$WEAKEN" "control-placebo=$base")
fi
[[ ${#ARMS[@]} -ge 2 ]] || { echo "$0: give two arms or more (or one and --controls)" >&2; exit 2; }
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
MM=.venv/bin/mmrlvr
run() { if [[ $DRY == 1 ]]; then echo "+ $*"; else "$@"; fi; }
spec_of() {   # the NAME=... spec of arm $1
  local arm; for arm in "${ARMS[@]}"; do [[ ${arm%%=*} == "$1" ]] && { echo "${arm#*=}"; return; }; done
  echo "$0: --check names arm '$1', which is not one of the arms" >&2; exit 2
}
mkdir -p "$OUT/checks"
MECH=(); SKIP=" "
for check in "${CHECKS[@]}"; do
  arm=${check%%=*}; method=${check#*=}; spec=$(spec_of "$arm")
  IFS="|" read -r -a parts <<< "$spec"; sets=()
  for o in "${parts[@]:1}"; do sets+=(--set "$o"); done
  MECH+=(--mechanism "$arm=$OUT/checks/$arm.json")
  if [[ -f $OUT/checks/$arm.json ]]; then
    echo "== mechanism check: $arm ($method): kept $OUT/checks/$arm.json"
  else
    echo "== mechanism check: $arm ($method) on ${parts[0]}"
    run $MM check-method "$method" --config "${parts[0]}" "${sets[@]}" --json "$OUT/checks/$arm.json"
  fi
  [[ $DRY == 1 ]] && continue
  verdict=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['verdict'])" \
            "$OUT/checks/$arm.json")
  if [[ $verdict == inactive && $TRAIN_INACTIVE == 0 ]]; then
    echo "   $arm: mechanism inactive: not trained (--train-inactive trains it anyway)"
    SKIP+="$arm "
  fi
done
train_one() {   # DIR SEED CONFIG OVERRIDES...: one run, its log and wall time
  local dir=$1 s=$2 cfg=$3 t0=$SECONDS; shift 3
  $MM train "$cfg" "$@" train.seed=$s train.steps=$STEPS train.eval_every=$STEPS train.save_every=0 \
      train.eval_samples=$SAMPLES train.out_dir=$dir --overwrite > "$dir.log" 2>&1 \
    || { echo "   failed: see $dir.log" >&2; return 1; }
  echo $((SECONDS - t0)) > "$dir.wall"
  tail -1 "$dir.log"
}
FAILED=0
for seed in $SEEDS; do
  for arm in "${ARMS[@]}"; do
    name=${arm%%=*}; spec=${arm#*=}; IFS="|" read -r -a parts <<< "$spec"
    [[ $SKIP == *" $name "* ]] && continue
    cfg=${parts[0]}; overrides=("${parts[@]:1}"); dir=$OUT/$name-s$seed
    s=$seed; [[ $name == control-placebo ]] && s=$((seed + 1000))
    [[ -f $dir/summary.json ]] && continue
    echo "== $name seed $s ($spec, $STEPS steps) -> $dir"
    if [[ $DRY == 1 ]]; then
      echo "+ $MM train $cfg ${overrides[*]} train.seed=$s train.steps=$STEPS train.out_dir=$dir"
      continue
    fi
    if [[ $JOBS -le 1 ]]; then
      train_one "$dir" "$s" "$cfg" "${overrides[@]}" || exit 1
    else
      train_one "$dir" "$s" "$cfg" "${overrides[@]}" &
      while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n || FAILED=1; done
    fi
  done
done
while [[ $(jobs -rp | wc -l) -gt 0 ]]; do wait -n || FAILED=1; done
[[ $FAILED == 0 ]] || { echo "$0: a run failed (its log is named above)" >&2; exit 1; }
ARGS=()
for arm in "${ARMS[@]}"; do
  name=${arm%%=*}; runs=()
  [[ $SKIP == *" $name "* ]] && continue
  for seed in $SEEDS; do runs+=("$OUT/$name-s$seed"); done
  ARGS+=(--arm "$name=$(IFS=,; echo "${runs[*]}")")
done
run $MM compare "${ARGS[@]}" "${MECH[@]}" --json "$OUT/compare.json" --plot "$OUT/compare.png" \
  | tee "$OUT/compare.md"
