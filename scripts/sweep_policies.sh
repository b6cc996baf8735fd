#!/usr/bin/env bash
# Threshold policies at one budget: keep 8 of 64 (top-K), or prune 7/8 by quantile or by
# the adaptive controller, or a fixed threshold on the score (4 jobs). Extra arguments go
# to the pipeline, e.g. `scripts/sweep_policies.sh predictor=linear,mlp`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m stopexp.pipeline -m +exp=toy_contrastive \
  policy=topk,quantile,adaptive,fixed policy.keep=8 policy.quantile=0.875 \
  policy.target_prune_rate=0.875 "$@"
