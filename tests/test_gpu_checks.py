"""The acceptance scripts for a GPU (scripts/check_gpu.py, scripts/check_gpu_vllm.py): every
check runs, a failed or broken one makes the exit code 1, the summary table says which;
their --dry forms run the same checks on the CPU."""
import importlib
import io
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

SCRIPTS = ROOT / "scripts"


def script(name: str, monkeypatch):
    """The module of scripts/<name>.py, imported as its command line imports it."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    return importlib.import_module(name)


def test_a_failed_or_broken_check_makes_the_exit_code_1_and_the_others_still_run(monkeypatch):
    gc = script("gpu_checks", monkeypatch)

    def broken():
        raise RuntimeError("while reading\nlayer 7 was never written")

    out = io.StringIO()
    code = gc.run_checks([("taps", lambda: gc.Verdict(True, "2.1e-03 (allowed 3.1e-02)")),
                          ("speed", lambda: gc.Verdict(False, "0.812x (target >= 0.95)")),
                          ("memory", broken),
                          ("keys", lambda: gc.Verdict(True, "two keys"))], out)
    text = out.getvalue()
    assert code == 1
    lines = text.splitlines()
    for line in ("PASS taps: 2.1e-03 (allowed 3.1e-02)", "FAIL speed: 0.812x (target >= 0.95)",
                 "FAIL memory: raised RuntimeError: layer 7 was never written", "PASS keys: two keys",
                 "2 of 4 checks passed"):
        assert line in lines, (line, text)
    assert "Traceback" in text  # a broken check's traceback is shown, above its line
    table = lines[lines.index("check   result  seconds  numbers"):]
    assert [row.split()[:2] for row in table[1:5]] == [["taps", "PASS"], ["speed", "FAIL"],
                                                       ["memory", "FAIL"], ["keys", "PASS"]]


def test_every_check_passed_is_exit_code_0_and_no_check_is_not(monkeypatch):
    gc = script("gpu_checks", monkeypatch)
    out = io.StringIO()
    assert gc.run_checks([("one", lambda: gc.Verdict(True, "1 <= 2"))], out) == 0
    assert out.getvalue().splitlines()[-1] == "1 of 1 checks passed"
    assert gc.run_checks([], io.StringIO()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
@pytest.mark.parametrize("name", ["check_gpu", "check_gpu_vllm"])
def test_without_cuda_the_gpu_form_says_so_in_one_line(name):
    if name == "check_gpu_vllm":
        pytest.importorskip("vllm", reason="vllm is not installed")
    done = subprocess.run([sys.executable, str(SCRIPTS / f"{name}.py")], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 2
    # the last line: importing vLLM's CPU build logs to stderr first
    assert done.stderr.strip().splitlines()[-1] == f"error: {name}.py needs CUDA; run it with --dry on a CPU"


def test_check_gpu_dry_runs_every_stage_in_bfloat16_and_an_injected_failure_exits_1(monkeypatch, capsys):
    """The dry form of the hf engine's check (the pipeline in bfloat16 on the CPU, its
    features against float32's teacher-forced ones, the keys), with one failing check added."""
    check_gpu = script("check_gpu", monkeypatch)
    real = check_gpu.checks
    failing = ("injected", lambda: check_gpu.Verdict(False, "an injected failure"))
    monkeypatch.setattr(check_gpu, "checks", lambda *args: [*real(*args), failing])
    code = check_gpu.main(["--dry"])
    out = capsys.readouterr().out
    assert code == 1, out
    for name in ("pipeline in bfloat16", "features = teacher-forced", "bank key of the numerics"):
        assert f"\nPASS {name}: " in out, out
    assert "\nFAIL injected: an injected failure\n" in out and out.endswith("3 of 4 checks passed\n")


@pytest.mark.slow
def test_check_gpu_vllm_dry_passes_every_check_on_the_cpu_build():
    """The vLLM check's dry form: a tiny random Llama on vLLM's CPU build (four engine starts)."""
    pytest.importorskip("vllm", reason="vllm is not installed")
    done = subprocess.run([sys.executable, str(SCRIPTS / "check_gpu_vllm.py"), "--dry"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "model runner V1 (" in done.stdout and "compile mode " in done.stdout
    assert done.stdout.endswith("5 of 5 checks passed\n"), done.stdout[-3000:]
