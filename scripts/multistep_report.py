"""How a config's trace bank fares on word problems with intermediate values: per split, the
per-path accuracy, the share of prompts with mixed outcomes, path lengths in tokens,
accuracy by the number of steps, and where the failing paths write their first wrong
intermediate value (stopexp/evaluation/first_errors.py).

    python -m stopexp.collect +exp=smollm2_multistep
    python scripts/multistep_report.py +exp=smollm2_multistep

Takes the config's bank (Hydra overrides, as collect's); needs no LM.
"""
from __future__ import annotations

import sys

import numpy as np

from stopexp.config import check_plan
from stopexp.evaluation.first_errors import bank_timing, timing_lines
from stopexp.store import bank
from stopexp.tasks import build_task
from stopexp.stages import build
from stopexp.runtime.overrides import stage_config


def split_lines(ds, problems, checks) -> list[str]:
    """The summary of one bank split (`problems`: the split's, by prompt id)."""
    correct = np.asarray(ds["correct"][:], dtype=bool)
    length = np.asarray(ds["length"][:])
    prompt = np.asarray(ds["prompt_id"][:])
    rates = np.array([correct[prompt == p].mean() for p in np.unique(prompt)])
    steps = np.array([len(problems[p].values) for p in prompt])
    by_steps = ", ".join(f"{s} steps {correct[steps == s].mean():.3f} ({(steps == s).sum()})"
                         for s in np.unique(steps))
    q = np.quantile(length, [0.1, 0.5, 0.9])
    return [f"{len(np.unique(prompt))} prompts x {len(ds) // max(len(np.unique(prompt)), 1)} paths: "
            f"per-path accuracy {correct.mean():.3f}, mixed prompts {np.mean((rates > 0) & (rates < 1)):.3f} "
            f"(all wrong {np.mean(rates == 0):.3f}, all right {np.mean(rates == 1):.3f})",
            f"  tokens per path: mean {length.mean():.1f}, p10 {q[0]:.0f}, median {q[1]:.0f}, "
            f"p90 {q[2]:.0f}; ended by a stop or EOS {np.mean(ds['finished'][:]):.3f}",
            f"  accuracy by steps: {by_steps}",
            *timing_lines(bank_timing(ds, checks))]


def main(argv: list[str]) -> None:
    cfg = stage_config("collect", argv)
    root = build.bank(cfg).root
    checks = [c for c, _ in check_plan(cfg.search, cfg.policy)]
    print(f"bank {root} (temperature {cfg.search.temperature}, steps {list(cfg.task.steps)}, "
          f"checks at {checks} tokens)")
    task = build_task(cfg.task)
    for split in ("train", "val", "test"):
        n = cfg.collect.prompts.get(split, 0)
        if n:
            lines = split_lines(bank.load_bank(root, split), task.problems(split, n), checks)
            print(f"[{split}] " + "\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
