"""Check the README's main-job table against a fresh run.

    scripts/main.sh                                       # the main job
    python scripts/check_readme_table.py outputs/runs/pipeline/<time>

Reads the table in the README's "What the main job shows" section and the run's
metrics.json (a pipeline or evaluate run dir), prints every number side by side and
exits 1 when one differs by more than the tolerance, or when a method or the protocol
(N, K, check tokens, prompts) differs. Wall seconds depend on the machine and are not
compared. Tolerances (absolute, in the printed units): accuracy, CI bounds, avg@K, ratio
and AUROCs `--tol` (default 0.01: two prompts of 200 for accuracy); tokens `--tokens-rtol`
(default 0.01, relative). With `--tol 0 --tokens-rtol 0` the table must match exactly.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## What the main job shows"
PROTOCOL = re.compile(r"Launch-Check-Resume (\d+) -> (\d+) at (\d+) tokens, (\d+) (\w+) prompts \((\w+)\)")
# column -> (metrics.json key, tokens-like?)
COLUMNS = {"accuracy": "accuracy", "ci_low": "accuracy_ci", "ci_high": "accuracy_ci",
           "avg@K": "avg_at_k", "tokens": "tokens_total", "ratio": "tokens_ratio",
           "AUROC": "auroc", "pooled": "auroc_pooled"}


def parse_table(text: str) -> dict:
    """The protocol line and per-method rows of the first table after `SECTION` in
    `text` (a README), or of a table as `stopexp.stages.evaluate.print_table` prints it.
    Returns {"protocol": {...}, "methods": {name: {column: float | None}}}; `-` is None.
    Raises ValueError naming what is missing."""
    if SECTION in text:
        text = text.split(SECTION, 1)[1]
    match = PROTOCOL.search(text)
    if not match:
        raise ValueError("no 'Launch-Check-Resume N -> K at T tokens, P split prompts (mode)' line")
    n, k, check, prompts, split, mode = match.groups()
    protocol = {"n": int(n), "k": int(k), "check_tokens": int(check), "prompts": int(prompts),
                "split": split, "mode": mode}
    lines = text[match.end():].splitlines()
    header = next((i for i, line in enumerate(lines) if line.split()[:2] == ["method", "accuracy"]), None)
    if header is None:
        raise ValueError("no 'method accuracy ...' header line after the protocol line")
    methods = {}
    for line in lines[header + 1:]:
        cells = line.split()
        if len(cells) < 8 or not re.fullmatch(r"\[[-\d.]+,[-\d.]+\]", cells[2]):
            break  # the table ends at the points line, the code fence or a blank line
        low, high = cells[2][1:-1].split(",")
        values = [cells[1], low, high, *cells[3:8]]
        methods[cells[0]] = {col: None if v == "-" else float(v) for col, v in zip(COLUMNS, values)}
    if not methods:
        raise ValueError("the table has no method rows")
    return {"protocol": protocol, "methods": methods}


def from_metrics(metrics: dict) -> dict:
    """The same structure as `parse_table`, rounded as the printed table rounds."""
    p = metrics["protocol"]
    protocol = {"n": p["n"], "k": p["k"], "check_tokens": p["check_tokens"],
                "prompts": p["prompts"], "split": p["split"], "mode": metrics["mode"]}
    methods = {}
    for name, r in metrics["methods"].items():
        row = {"accuracy": r["accuracy"], "ci_low": r["accuracy_ci"][0], "ci_high": r["accuracy_ci"][1],
               "avg@K": r["avg_at_k"], "tokens": r["tokens_total"], "ratio": r["tokens_ratio"],
               "AUROC": r.get("auroc"), "pooled": r.get("auroc_pooled")}
        methods[name] = {k: None if v is None else round(float(v), 0 if k == "tokens" else
                                                        2 if k == "ratio" else 3)
                         for k, v in row.items()}
    return {"protocol": protocol, "methods": methods}


def compare(readme: dict, fresh: dict, tol: float = 0.01, tokens_rtol: float = 0.01) -> list[str]:
    """Every difference beyond the tolerances, one line each (empty: they agree)."""
    problems = [f"protocol {k}: README {v!r}, run {fresh['protocol'].get(k)!r}"
                for k, v in readme["protocol"].items() if fresh["protocol"].get(k) != v]
    for name in readme["methods"].keys() - fresh["methods"].keys():
        problems.append(f"{name}: in the README, not in the run")
    for name in fresh["methods"].keys() - readme["methods"].keys():
        problems.append(f"{name}: in the run, not in the README")
    for name in readme["methods"].keys() & fresh["methods"].keys():
        want, got = readme["methods"][name], fresh["methods"][name]
        for col in COLUMNS:
            a, b = want[col], got[col]
            if a is None or b is None:
                if a is not b:
                    problems.append(f"{name} {col}: README {a}, run {b}")
                continue
            limit = tokens_rtol * abs(a) if col == "tokens" else tol
            if abs(a - b) > limit + 1e-9:
                problems.append(f"{name} {col}: README {a:g}, run {b:g} (differs by {b - a:+g})")
    return problems


def side_by_side(readme: dict, fresh: dict) -> str:
    """README value / run value per method and column, `=` where they are equal."""
    cols = list(COLUMNS)
    lines = [f"{'method':<14}" + "".join(f"{c:>19}" for c in cols)]
    for name, want in readme["methods"].items():
        got = fresh["methods"].get(name, {})
        cells = []
        for c in cols:
            a, b = want[c], got.get(c)
            cells.append("=" if a == b else f"{a if a is not None else '-'} / {b if b is not None else '-'}")
        lines.append(f"{name:<14}" + "".join(f"{x:>19}" for x in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="a pipeline or evaluate run dir (holds metrics.json)")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--tol", type=float, default=0.01)
    ap.add_argument("--tokens-rtol", type=float, default=0.01)
    args = ap.parse_args(argv)
    path = args.run_dir / "metrics.json"
    try:
        readme = parse_table(args.readme.read_text())
        fresh = from_metrics(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"check_readme_table: {type(e).__name__}: {e} ({args.readme} / {path})")
    print(f"README ({args.readme}) / run ({path}), '=' where equal:")
    print(side_by_side(readme, fresh))
    problems = compare(readme, fresh, args.tol, args.tokens_rtol)
    if problems:
        print(f"\n{len(problems)} difference(s) beyond tolerance (tol {args.tol}, tokens rtol "
              f"{args.tokens_rtol}):\n  " + "\n  ".join(problems))
        return 1
    print(f"\nthe README's table matches (tol {args.tol}, tokens rtol {args.tokens_rtol})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
