"""Sweep the combined controller's knobs by replay on one answers-only bank (AIME24 by
default: the reported banks, AIME25 and HMMT25, are never tuned on) and print the table.

    python scripts/tune_combined.py /work/data/parallel-probe/aime24.json --shuffles 20

Every setting sees the same draws (n branches of each prompt, Parallel-Probe's shuffler).
The chosen setting is the one with the fewest tokens per prompt whose accuracy is at least
SC@n's (no_prune on the same draws) minus --slack points; the one chosen on AIME24 is the
controller's defaults (stopexp.stopping.combined.Combined: evaluate.stopping.combined.* and
answers_replay's stopping.combined.*)."""
from __future__ import annotations

import argparse
import itertools

import numpy as np

from stopexp.stopping.answers_bank import load_answers_bank
from stopexp.stopping.branch_draws import draws, no_prune
from stopexp.stopping.combined import answers_timeline, combined

GRID = {"first": (2, 4, 8), "wave": (2, 4, 8), "threshold": (0.95, 0.99),
        "settle": (20.0, 30.0, 40.0), "prune_below": (0.0, 3.0, 8.0), "prune_confidence": (0.75,)}


def sweep(path: str, n: int, shuffles: int) -> tuple[dict, list[dict]]:
    """SC@n's accuracy and tokens, and one row per setting of GRID (accuracy in %, tokens
    per prompt), over the same draws."""
    bank = load_answers_bank(path)
    orders = draws(bank, n, shuffles, 0, "python")
    pairs = [(q, answers_timeline(q, o), o) for d in orders for q, o in zip(bank.prompts, d)]
    base = [no_prune(q, o) for q, _, o in pairs]
    sc = {"accuracy": 100 * np.mean([q.correct[d.answer] for (q, _, _), d in zip(pairs, base)]),
          "tokens": float(np.mean([d.spent.sum() for d in base]))}
    rows = []
    for values in itertools.product(*GRID.values()):
        knobs = dict(zip(GRID, values))
        runs = [combined(tl, **knobs) for _, tl, _ in pairs]
        rows.append({**knobs, "accuracy": 100 * np.mean([q.correct[r.answer] for (q, _, _), r in zip(pairs, runs)]),
                     "tokens": float(np.mean([r.spent.sum() for r in runs]))})
    return sc, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bank", nargs="?", default="/work/data/parallel-probe/aime24.json")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--shuffles", type=int, default=20)
    ap.add_argument("--slack", type=float, default=0.0, help="accuracy points below SC@n allowed")
    a = ap.parse_args()
    sc, rows = sweep(a.bank, a.n, a.shuffles)
    print(f"SC@{a.n} (no_prune): {sc['accuracy']:.2f}% / {sc['tokens']:,.0f} tokens per prompt, "
          f"{a.shuffles} shuffles")
    print(" ".join(f"{k:>16}" for k in GRID) + f"{'accuracy':>10}{'tokens':>10}")
    for r in sorted(rows, key=lambda r: r["tokens"]):
        print(" ".join(f"{r[k]:>16}" for k in GRID) + f"{r['accuracy']:>10.2f}{r['tokens']:>10,.0f}")
    ok = [r for r in rows if r["accuracy"] >= sc["accuracy"] - a.slack]
    best = min(ok, key=lambda r: r["tokens"]) if ok else None
    print("chosen:", {k: best[k] for k in GRID} if best else f"none within {a.slack} points of SC@{a.n}")


if __name__ == "__main__":
    main()
