#!/usr/bin/env bash
# Create .venv and install mmrlvr with its test extras. Safe to re-run: it skips the installs
# when pyproject.toml and this script are unchanged since the last successful run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.setup-stamp
want=$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
echo "[setup] installing torch, torchvision and mmrlvr into .venv (a few minutes the first time)"
.venv/bin/python -m pip install -q --upgrade pip
# torch 2.14.1 + torchvision 0.29.1: the pair Qwen-VL processors and qwen-vl-utils need
# (a CUDA build that also runs on CPU).
.venv/bin/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
.venv/bin/python -m pip install -q -e ".[test]"
echo "$want" > "$stamp"
