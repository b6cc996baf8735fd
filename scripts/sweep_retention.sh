#!/usr/bin/env bash
# Retention K x launched paths N, checking at each of the two tap checkpoints (4 x 3 x 2
# = 24 jobs; N changes the bank, K and the check do not). Every job also reports each K of
# evaluate.retention, which scripts/fit_retention.py fits the guideline to; that fit also
# needs the task length to vary: add e.g. task.n_steps=4,6,8 (the toy LM is then trained
# once per length). Extra arguments go to the pipeline.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m stopexp.pipeline -m +exp=toy_contrastive \
  policy.keep=2,4,8,16 search.n_paths=16,32,64 \
  'search.check_at=${tap.checkpoints.0},${tap.checkpoints.1}' \
  'evaluate.retention=[2,4,8,16]' 'evaluate.n_points=[8,16]' "$@"
