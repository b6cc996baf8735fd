#!/usr/bin/env bash
# Tap layer x predictor x loss on the embedded default (3 x 2 x 3 = 18 jobs, one W&B group).
# Extra arguments go to the pipeline, e.g. `scripts/sweep_taps.sh hydra/launcher=submitit_slurm`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m stopexp.pipeline -m +exp=toy_contrastive \
  'tap.layers=[0],[1],[-1]' predictor=linear,mlp loss=contrastive,pairwise,reward_regression "$@"
