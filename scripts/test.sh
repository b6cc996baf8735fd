#!/usr/bin/env bash
# The test suite (fast tests; add `-m slow` for the long end-to-end checks).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest -q "$@"
