#!/usr/bin/env bash
# Run the CPU quickstart and check it printed the README's figures (scripts/check_quickstart.py).
# About 8.5 minutes on 2 cores (the quickstart trains on one thread).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/quickstart.sh "$@"
.venv/bin/python scripts/check_quickstart.py
