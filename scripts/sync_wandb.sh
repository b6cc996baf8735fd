#!/usr/bin/env bash
# Upload offline W&B runs (default: every outputs/wandb/wandb/offline-run-*), keeping W&B's
# own files (debug logs, cache, settings) under outputs/wandb, as the stages do
# (stopexp/runtime/tracking.py: wandb_dirs); run from anywhere, extra arguments go to `wandb sync`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD/outputs/wandb
export WANDB_DIR=$root WANDB_CACHE_DIR=$root/.cache WANDB_DATA_DIR=$root/.data \
  WANDB_CONFIG_DIR=$root/.config WANDB_ARTIFACT_DIR=$root/.artifacts
mkdir -p "$root/wandb"
if [ $# -eq 0 ]; then set -- "$root"/wandb/offline-run-*; fi
exec .venv/bin/wandb sync "$@"
