#!/usr/bin/env bash
# Run the CPU quickstart and check it printed the README's figures (scripts/check_quickstart.py).
# `.ci/run` runs this after the suite: about 7.5 minutes on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/quickstart.sh "$@"
.venv/bin/python scripts/check_quickstart.py
