"""The preregistered primary comparison (docs/results.md, "Preregistration: the confirmatory
replication"), read from the metrics.json of one evaluate run on the confirmatory split:

    python scripts/confirm_report.py outputs/runs/evaluate/<run> [--probe mlp]

- P1: the probe minus confidence, within-prompt AUROC at the first check (evaluate's
  `paired`: the paired bootstrap over the prompts with both outcomes there, its 95% interval
  and bootstrap p);
- P2: its Launch-Check-Resume vote accuracy minus confidence's at the same kept paths
  (`paired.accuracy_diff`);
- P3: its vote accuracy minus all N paths' (no_prune) at the probe's tokens
  (`methods.<probe>.vs_no_prune.accuracy_diff`), with that share of no_prune's tokens.

P2 and P3 are one family of two under Holm (stopexp.metrics.multiplicity). The decision
rule: P1 "replicated" where its interval lies above 0; P2 and P3 "the votes replicate"
where Holm's p is at most 0.05 with the difference above 0. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stopexp.metrics.multiplicity import ALPHA, holm  # noqa: E402


def primary(metrics: dict, probe: str) -> list[dict]:
    """P1, P2, P3 as rows {"name", "diff", "ci", "p", "p_holm" (P2, P3), "verdict"}."""
    paired, methods = metrics["paired"], metrics["methods"]
    if probe not in methods or probe not in paired["accuracy_diff"]:
        raise SystemExit(f"error: --probe: {probe!r} is no probe of this run; its probes: "
                         f"{', '.join(sorted(paired['accuracy_diff']))}")
    check = paired["checks"][0]
    p1 = {"name": f"P1: {probe} - confidence, within-prompt AUROC at {check['tokens']} tokens",
          **check["auroc_diff"][probe]["confidence"]}
    p1["verdict"] = "replicated" if p1["ci"][0] > 0 else "not replicated"
    share = methods[probe]["tokens_total"] / methods["no_prune"]["tokens_total"]
    votes = [{"name": f"P2: {probe} - confidence, vote accuracy (the same kept paths)",
              **paired["accuracy_diff"][probe]["confidence"]},
             {"name": f"P3: {probe} - no_prune, vote accuracy ({share:.2f} of its tokens)",
              **methods[probe]["vs_no_prune"]["accuracy_diff"]}]
    for row, adjusted in zip(votes, holm([row["p"] for row in votes])):
        row["p_holm"] = float(adjusted)
        row["verdict"] = ("the votes replicate" if adjusted <= ALPHA and row["diff"] > 0
                          else "not replicated")
    return [p1, *votes]


def table(rows: list[dict]) -> str:
    lines = ["| comparison | difference [95% interval] | p | Holm's p (P2, P3) | verdict |",
             "|---|---|---|---|---|"]
    for r in rows:
        holm_p = f"{r['p_holm']:.4f}" if "p_holm" in r else "-"
        lines.append(f"| {r['name']} | {r['diff']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}] | "
                     f"{r['p']:.4f} | {holm_p} | {r['verdict']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="an evaluate run dir (its metrics.json)")
    ap.add_argument("--probe", default="mlp", help="the probe's method name (default mlp)")
    args = ap.parse_args(argv)
    path = args.run / "metrics.json"
    if not path.is_file():
        raise SystemExit(f"error: run: {path} does not exist; give an evaluate run dir")
    out = table(primary(json.loads(path.read_text()), args.probe))
    print(out)
    return out


if __name__ == "__main__":
    main()
