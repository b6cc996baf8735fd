#!/usr/bin/env bash
# The four runs whose metrics.json must not change when code only moves: the main job,
# beam search checked at every step, online adaptation and data-to-text. Each starts from
# an empty cache under OUT, so every artifact is made by the code being checked.
#
#   scripts/behaviour_runs.sh /tmp/before            # on the old code
#   scripts/behaviour_runs.sh /tmp/after             # on the new code
#   for r in main beam_every_step shift datatotext; do
#     .venv/bin/python scripts/compare_runs.py /tmp/before/$r /tmp/after/$r; done
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/behaviour_runs.sh OUT}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} WANDB_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-.venv/bin/python}
run() {  # name module overrides...
  local name=$1 module=$2; shift 2
  "$PY" -m "stopexp.$module" "$@" logger=none paths.cache_dir="$OUT/cache" \
    paths.output_dir="$OUT/outputs" hydra.run.dir="$OUT/$name" > "$OUT/$name.log" 2>&1 \
    || { echo "$name failed: see $OUT/$name.log"; exit 1; }
  echo "$name: $OUT/$name/metrics.json"
}
mkdir -p "$OUT"
run main pipeline +exp=toy_contrastive
run beam_every_step pipeline +exp=toy_beam_every_step
# adapt replays two banks with their features and predictors: the source's and the
# target's (adapt.target's keys in place, its toy LM another seed)
TARGET=("task.styles={careful:0.8,shortcut:0.2}" model.toy.seed=1 collect.mc_rollouts=4)
for stage in collect featurize train; do run "shift_source_$stage" "$stage" +exp=toy_shift; done
run shift_target_lm toy_lm +exp=toy_shift "${TARGET[@]}"
for stage in collect featurize train; do run "shift_target_$stage" "$stage" +exp=toy_shift "${TARGET[@]}"; done
run shift adapt +exp=toy_shift
run datatotext pipeline +exp=toy_datatotext
