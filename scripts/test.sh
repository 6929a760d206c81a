#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite on CPU, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest tests "$@"
