#!/usr/bin/env bash
# Threshold policies at one budget: keep 8 of 64 (top-K), or prune 7/8 by quantile or by
# the adaptive controller, or a fixed threshold on the score (4 jobs). Extra arguments go
# to the pipeline; each budget is set where the job's policy reads it (validate refuses a
# knob the policy ignores), e.g. `scripts/sweep_policies.sh predictor=linear,mlp`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m stopexp.pipeline -m +exp=toy_contrastive \
  policy=topk,quantile,adaptive,fixed 'policy.keep=${stopexp_where_read:policy.keep,8}' \
  'policy.quantile=${stopexp_where_read:policy.quantile,0.875}' \
  'policy.target_prune_rate=${stopexp_where_read:policy.target_prune_rate,0.875}' "$@"
