"""Wall time of `python -m stopexp.answers_replay` on answers-only banks, with the
equivalence grader as it is and, with --baseline, without its cheap disproof
(`stopexp.metrics.disproof`: every pair of distinct answers then goes to math-verify's
`verify`); checks that both give the same metrics, number for number.

    python scripts/bench_answers_replay.py                      # the three Parallel-Probe banks
    python scripts/bench_answers_replay.py BANK.json ... --shuffles 20 --n 64
    python scripts/bench_answers_replay.py --baseline --shuffles 2 --timeout 900

Each run is a fresh process (no answer parsed or compared in an earlier run is cached).
Prints one row per bank: seconds with the disproof, without it (--baseline), their ratio,
and whether the metrics are identical.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stopexp.core.commands import override

BANKS = [Path("/work/data/parallel-probe") / f"{b}.json" for b in ("aime24", "aime25", "hmmt25")]

ONE = """
import sys
import stopexp.metrics.answers as answers
if sys.argv[1] == "baseline":
    answers.differ = lambda gold, pred: False
from stopexp.answers_replay import main
sys.argv = ["answers_replay", *sys.argv[2:]]
main()
"""


def timed(bank: Path, mode: str, n: int, shuffles: int, timeout: int) -> tuple[float | None, dict | None]:
    """(seconds, metrics) of one replay in a fresh process; (None, None) past `timeout`."""
    with tempfile.TemporaryDirectory() as out:
        start = time.time()
        try:
            subprocess.run([sys.executable, "-c", ONE, mode, override("bank", str(bank)), f"n={n}",
                            f"shuffles={shuffles}", override("hydra.run.dir", out)],
                           check=True, timeout=timeout, capture_output=True)
        except subprocess.TimeoutExpired:
            return None, None
        seconds = time.time() - start
        metrics = json.loads((Path(out) / "metrics.json").read_text())
    metrics.pop("plots", None)  # the temporary directory's name
    return seconds, metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("banks", nargs="*", type=Path, default=BANKS)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--shuffles", type=int, default=20)
    ap.add_argument("--baseline", action="store_true", help="also time it without the disproof")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per run")
    args = ap.parse_args()
    print(f"n={args.n} shuffles={args.shuffles}")
    print(f"{'bank':<12}{'with (s)':>10}{'without (s)':>13}{'ratio':>8}  same metrics")
    for bank in args.banks:
        fast, fast_metrics = timed(bank, "disproof", args.n, args.shuffles, args.timeout)
        slow, slow_metrics = (timed(bank, "baseline", args.n, args.shuffles, args.timeout)
                              if args.baseline else (None, None))
        show = lambda s: "-" if s is None else f"{s:.1f}"  # noqa: E731
        ratio = f"{slow / fast:.1f}x" if fast and slow else "-"
        same = "-" if slow_metrics is None or fast_metrics is None else str(fast_metrics == slow_metrics)
        if args.baseline and slow is None:
            same = f"baseline past {args.timeout} s"
        print(f"{bank.stem:<12}{show(fast):>10}{show(slow):>13}{ratio:>8}  {same}", flush=True)


if __name__ == "__main__":
    main()
