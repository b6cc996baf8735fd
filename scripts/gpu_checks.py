"""The acceptance checks' report and exit code (scripts/check_gpu.py, scripts/check_gpu_vllm.py):
each check is a function returning a `Verdict`; `run_checks` runs them all, a check that
raises failing with its error's first line while the others still run, prints one line per
check and a summary table, and returns the exit code (0: every check passed, 1: one did not).
The standard library only, so that a machine without vLLM imports it.
"""
from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, TextIO


@dataclass(frozen=True)
class Verdict:
    """What a check found: whether it passed, and its numbers against what is allowed."""
    passed: bool
    numbers: str


@dataclass(frozen=True)
class Outcome:
    name: str
    verdict: Verdict
    seconds: float


def run_check(name: str, check: Callable[[], Verdict], out: TextIO) -> Outcome:
    """Run one check; one that raises fails with its error's last line (its traceback to `out`)."""
    start = time.perf_counter()
    try:
        verdict = check()
    except Exception as e:  # noqa: BLE001 (a broken check is a failed one; the others still run)
        traceback.print_exc(file=out)
        lines = str(e).strip().splitlines()
        verdict = Verdict(False, f"raised {type(e).__name__}: {lines[-1] if lines else ''}")
    outcome = Outcome(name, verdict, time.perf_counter() - start)
    print(f"{'PASS' if verdict.passed else 'FAIL'} {name}: {verdict.numbers}", file=out, flush=True)
    return outcome


def summary(outcomes: list[Outcome]) -> str:
    """The table printed at the end: one row per check."""
    width = max([len(o.name) for o in outcomes] + [5])
    rows = [f"{'check':<{width}}  result  seconds  numbers"]
    rows += [f"{o.name:<{width}}  {'PASS' if o.verdict.passed else 'FAIL':<6}  {o.seconds:>7.1f}  "
             f"{o.verdict.numbers}" for o in outcomes]
    failed = sum(not o.verdict.passed for o in outcomes)
    rows.append(f"{len(outcomes) - failed} of {len(outcomes)} checks passed")
    return "\n".join(rows)


def run_checks(checks: list[tuple[str, Callable[[], Verdict]]], out: TextIO | None = None) -> int:
    """Run `checks` (name, function) in order, reporting to `out` (None: standard output);
    the summary table; the exit code."""
    out = out or sys.stdout
    outcomes = [run_check(name, check, out) for name, check in checks]
    print("\n" + summary(outcomes), file=out, flush=True)
    return 0 if outcomes and all(o.verdict.passed for o in outcomes) else 1
