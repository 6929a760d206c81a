#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite on CPU, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The browser test drives Debian's Chromium through pip's playwright (no browser download).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[test] installing Debian's chromium for the browser test"
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
    || echo "[test] chromium could not be installed; the browser test will skip"
fi
# The HTML-patch renderer's tests draw with Liberation Sans and DejaVu Sans (Debian's fonts).
if ! fc-list 2>/dev/null | grep -qi "Liberation Sans" && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[test] installing Debian's fonts-liberation and fonts-dejavu-core for the renderer tests"
  (apt-get update -qq && apt-get install -y -qq fonts-liberation fonts-dejavu-core >/dev/null) \
    || echo "[test] the fonts could not be installed; the renderer tests will fail"
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two pytest-xdist workers (MMRLVR_TEST_WORKERS; 0 runs in this process), a test file per worker
# at a time: one worker alone left a core idle most of the run (the tiny models' kernels are too
# small for two threads). Each file keeps its module fixtures on one worker.
workers=${MMRLVR_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest tests "$@"
fi
exec .venv/bin/python -m pytest tests -n "$workers" --dist loadfile "$@"
