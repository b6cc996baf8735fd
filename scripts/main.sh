#!/usr/bin/env bash
# The main job: the whole pipeline, offline, on a CPU. Without arguments it runs the
# embedded default (+exp=toy_contrastive); `scripts/main.sh +exp=smollm2_contrastive` runs
# the real small LM instead; other arguments are passed on as overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The LM's features differ in their last bits with torch's thread count, which can move a
# number of the README's table by a prompt; the table was made with 2 threads.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
case " $* " in
  *" +exp="*) exec .venv/bin/python -m stopexp.pipeline "$@" ;;
  *) exec .venv/bin/python -m stopexp.pipeline +exp=toy_contrastive "$@" ;;
esac
