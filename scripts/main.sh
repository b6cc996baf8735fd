#!/usr/bin/env bash
# The main job on the embedded default: the whole pipeline, offline, on a CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m stopexp.pipeline +exp=toy_contrastive "$@"
