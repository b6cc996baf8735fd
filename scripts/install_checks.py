"""What scripts/setup.sh checks before it installs anything (standard library only, run by
any python3): an interpreter the pins run on (`pick_python`: pyproject.toml's
requires-python), and on a GPU node a driver that runs the CUDA build of the GPU set's torch
(`driver_problem`: nvidia-smi's CUDA version against requirements-gpu.txt's CUDA pins).
Each says what is wrong and what to do in one line; scripts/check_gpu_install.py --python /
--driver are their command lines."""
from __future__ import annotations

import operator
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# tried in turn where PYTHON is unset and there is no .venv yet: the tested version first
CANDIDATES = ("python3", "python3.11", "python3.12", "python3.13", "python3.14")
# the oldest driver of each CUDA major version (NVIDIA's CUDA release notes, Linux)
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt,
        "==": operator.eq, "!=": operator.ne}


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def requires_python(root: Path = ROOT) -> str:
    """pyproject.toml's requires-python (">=3.11.5,<3.15")."""
    found = re.search(r'^requires-python\s*=\s*"([^"]+)"', (root / "pyproject.toml").read_text(), re.M)
    return found.group(1)


def satisfies(have: tuple[int, ...], spec: str) -> bool:
    """`have` meets every clause of `spec` (">=3.11.5,<3.15"), compared as release numbers
    padded with zeros."""
    for clause in spec.split(","):
        op, want = re.fullmatch(r"\s*(>=|<=|==|!=|>|<)\s*([\d.]+)\s*", clause).groups()
        w = version(want)
        n = max(len(have), len(w))
        if not _OPS[op](have + (0,) * (n - len(have)), w + (0,) * (n - len(w))):
            return False
    return True


def python_version(python: str) -> tuple[int, ...] | None:
    """The version of the interpreter `python` (a path or a name on the PATH), None where
    it does not run."""
    exe = shutil.which(python)
    if exe is None:
        return None
    try:
        run = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:3])"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return version(run.stdout) if run.returncode == 0 else None


def pick_python(given: str | None, root: Path = ROOT) -> tuple[str | None, str]:
    """(the interpreter to make .venv with, or None; why): .venv's own where it exists (it
    is kept), else `given` (PYTHON), else the first of CANDIDATES that runs the pins."""
    spec, venv = requires_python(root), root / ".venv" / "bin" / "python"
    needs = f"stopexp's pins need Python {spec} (numpy 2.4 and vLLM 0.32: >= 3.11, vLLM < 3.15)"
    if venv.exists():
        have = python_version(str(venv))
        if have is not None and satisfies(have, spec):
            return str(venv), ""
        shown = ".".join(map(str, have)) if have else "an interpreter that does not run"
        return None, (f".venv has {shown}; {needs}: remove it (rm -r .venv) and run "
                      "scripts/setup.sh again")
    found = []
    for name in [given] if given else CANDIDATES:
        have = python_version(name)
        if have is not None and satisfies(have, spec):
            return shutil.which(name), ""
        found.append(f"{name} {'.'.join(map(str, have)) if have else 'not found'}")
    return None, (f"{needs}; found {', '.join(found)}: install one (e.g. `uv python install "
                  "3.11` or your distribution's python3.11) and run PYTHON=/path/to/python3.11 "
                  "scripts/setup.sh")


def cuda_build(gpu_requirements: Path = ROOT / "requirements-gpu.txt") -> tuple[int, ...]:
    """The CUDA version the GPU set's torch is built for: its cuda-toolkit pin (else
    nvidia-cuda-runtime's), major and minor."""
    text = gpu_requirements.read_text()
    for name in ("cuda-toolkit", "nvidia-cuda-runtime"):
        found = re.search(rf"^{name}==([\d.]+)", text, re.M)
        if found:
            return version(found.group(1))[:2]
    raise SystemExit(f"{gpu_requirements.name} pins neither cuda-toolkit nor nvidia-cuda-runtime")


def driver_problem(smi_output: str, build: tuple[int, ...]) -> str | None:
    """Why the driver nvidia-smi describes cannot run a CUDA `build` (major, minor) torch,
    and what to do; None where it can, or where nvidia-smi does not say (not checked)."""
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", smi_output)
    if cuda is None:
        return None
    driver = re.search(r"Driver Version:\s*([\d.]+)", smi_output)
    if version(cuda.group(1))[:1] >= build[:1]:  # minor versions of one major are compatible
        return None
    need = ".".join(map(str, build))
    oldest = MIN_DRIVER.get(build[0], "newer")
    return (f"the NVIDIA driver {driver.group(1) if driver else '?'} runs CUDA {cuda.group(1)} "
            f"at most, and the GPU set's torch is the CUDA {need} build (driver >= {oldest}): "
            f"installed, it would see no GPU. Update the driver to {oldest} or later; or install "
            f"NVIDIA's forward-compatibility package (cuda-compat-{build[0]}-{build[1]}, "
            "data-center GPUs) and run STOPEXP_DRIVER_CHECK=0 scripts/setup.sh; or install a "
            "CUDA 12 set by hand (torch from https://download.pytorch.org/whl/cu128 and a CUDA "
            "12 build of vLLM 0.32.0), which stopexp does not pin (docs/engines.md#install)")


def nvidia_smi() -> str:
    """nvidia-smi's summary (its header names the driver and its CUDA version); "" where it
    is not on the PATH or fails."""
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        return subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
