#!/usr/bin/env bash
# The test suite (fast tests; add `-m slow` for the long end-to-end checks), on two worker
# processes with one torch thread each (pytest-xdist; a test file stays on one worker, so a
# module's session fixtures, such as the vLLM engine, start once). STOPEXP_TEST_WORKERS
# sets their number (0: one process).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest -q -n "${STOPEXP_TEST_WORKERS:-2}" --dist loadfile "$@"
