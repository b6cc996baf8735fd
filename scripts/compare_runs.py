"""Check that two runs of the same command give the same metrics.json.

    python scripts/compare_runs.py outputs/before/run outputs/after/run [--rtol 0]

Walks both metrics.json files and prints every value that differs (exit 1) or says they
agree (exit 0). What depends on the machine or the moment, not on the code, is left out:
wall time and rates (keys ending in `_s`, `seconds`, `per_s`, `wall`, and `check_share`, the check's share of the wall time), where files were
written (string values that are paths under either run's output or cache dirs), and the
process's memory (`rss`). Everything else must be equal, BERTScore too (its batches
depend on the texts only, stopexp.metrics.text_similarity); `--rtol` allows a relative difference
for floats (0: bit-equal as printed by json).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

MACHINE_KEYS = re.compile(r"(_s|seconds|per_s|wall|rss|check_share|_dir|checkpoint|features)$")


def differences(a, b, where: str = "", rtol: float = 0.0) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in the first" for k in a.keys() - b.keys()
               if not MACHINE_KEYS.search(k)]
        out += [f"{where}.{k}: only in the second" for k in b.keys() - a.keys()
                if not MACHINE_KEYS.search(k)]
        for k in sorted(a.keys() & b.keys()):
            if not MACHINE_KEYS.search(k):
                out += differences(a[k], b[k], f"{where}.{k}", rtol)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]", rtol)]
    if isinstance(a, str) and isinstance(b, str) and ("/" in a and "/" in b):
        return []  # a path: where this run wrote, not what it measured
    if isinstance(a, float) and isinstance(b, float):
        if (math.isnan(a) and math.isnan(b)) or a == b or abs(a - b) <= rtol * max(abs(a), abs(b)):
            return []
    elif a == b:
        return []
    return [f"{where}: {a!r} vs {b!r}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path, help="a run dir (holds metrics.json) or a metrics.json")
    ap.add_argument("second", type=Path)
    ap.add_argument("--rtol", type=float, default=0.0)
    args = ap.parse_args(argv)
    files = [p / "metrics.json" if p.is_dir() else p for p in (args.first, args.second)]
    try:
        a, b = (json.loads(p.read_text()) for p in files)
    except (OSError, ValueError) as e:
        sys.exit(f"compare_runs: {e}")
    found = differences(a, b, "metrics", args.rtol)
    if found:
        print(f"{len(found)} difference(s) between {files[0]} and {files[1]}:\n  " + "\n  ".join(found))
        return 1
    print(f"{files[0]} and {files[1]} agree (rtol {args.rtol})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
