#!/usr/bin/env bash
# The zoom task with and without the zoom tool (docs/tools.md, "The zoom task"): per seed, the
# same tiny model is warm-started (SFT) and trained (GRPO) twice at equal steps: `tools` on the
# gold trajectories (call, crop, answer) and with the tool in its rollouts; `plain` on the direct
# answers, single-turn. Every pipeline runs in the background on one thread (nice), all at once;
# then `mmrlvr compare` pairs the held-out answers (run-level interval over the seeds) and
# bench/tool_plot.py draws the before/after figure.
#
#   bash bench/zoom_compare.sh [--seeds "0 1 2"] [--sft-steps 300] [--steps 20] [--out runs/zcmp]
#        [--init runs/tiny-zoom-vision] [--png docs/img/zoom_tools.png]
#
# Needs runs/zoom and runs/tiny-zoom (the commands in configs/zoom_tools_cpu.yaml's header). Both
# arms start from --init: by default the tiny model with its vision tower pretrained first
# (`mmrlvr pretrain-vision` on runs/zoom/vision.jsonl: each box's count and colour from the
# whole image, and the count and colour of each question's crop), built here once; `--init
# runs/tiny-zoom` starts from the random tower. A run that already has a summary.json is kept,
# so an interrupted comparison resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS="0 1 2"; SFT_STEPS=300; STEPS=20; OUT=runs/zcmp; EVAL=200; INIT=runs/tiny-zoom-vision
PNG=docs/img/zoom_tools.png
while [[ $# -gt 0 ]]; do
  case $1 in
    --seeds) SEEDS=$2; shift 2;; --sft-steps) SFT_STEPS=$2; shift 2;; --steps) STEPS=$2; shift 2;;
    --out) OUT=$2; shift 2;; --eval) EVAL=$2; shift 2;; --init) INIT=$2; shift 2;;
    --png) PNG=$2; shift 2;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2;;
  esac
done
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
MM=.venv/bin/mmrlvr
CFG=configs/zoom_tools_cpu.yaml
PLAIN=(rollout.tools=[] rollout.max_turns=1 rollout.max_trajectory_tokens=0 data.system_prompt=
       rollout.max_new_tokens=24)
mkdir -p "$OUT"
if [[ ! -f $INIT/config.json ]]; then
  nice -n 10 $MM pretrain-vision --model runs/tiny-zoom --data runs/zoom/vision.jsonl \
      --eval runs/zoom/vision_test.jsonl --out "$INIT" --steps 1000 --min-pixels 3136 \
      --max-pixels 3136 --threads 1 > "$OUT/pretrain-vision.json" 2>&1
fi
pipeline() {   # ARM SEED OVERRIDES...
  local arm=$1 seed=$2; shift 2
  local dir=$OUT/$arm-s$seed
  [[ -f $dir/summary.json ]] && return 0
  nice -n 10 $MM sft $CFG "$@" train.seed=$seed train.threads=1 sft.init=$INIT sft.steps=$SFT_STEPS data.eval= \
      sft.out_dir=$dir-sft --overwrite > "$dir-sft.log" 2>&1 || { echo "failed: $dir-sft.log" >&2; return 1; }
  nice -n 10 $MM train $CFG "$@" model.path=$dir-sft/final train.seed=$seed train.threads=1 \
      train.steps=$STEPS train.eval_every=$STEPS train.save_every=0 data.eval_limit=$EVAL \
      train.out_dir=$dir --overwrite > "$dir.log" 2>&1 || { echo "failed: $dir.log" >&2; return 1; }
  echo "done $dir"
}
pids=()
for seed in $SEEDS; do
  pipeline tools "$seed" & pids+=($!)
  pipeline plain "$seed" "${PLAIN[@]}" & pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[[ $fail == 0 ]] || exit 1
ARGS=()
for arm in plain tools; do
  runs=(); for seed in $SEEDS; do runs+=("$OUT/$arm-s$seed"); done
  ARGS+=(--arm "$arm=$(IFS=,; echo "${runs[*]}")")
done
$MM compare "${ARGS[@]}" --json "$OUT/compare.json" | tee "$OUT/compare.md"
.venv/bin/python bench/tool_plot.py zoom --arm "without tools=${ARGS[1]#plain=}" \
  --arm "with zoom=${ARGS[3]#tools=}" --png "$PNG"
