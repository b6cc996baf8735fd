"""Replay stopping methods on an answers-only bank (`stopexp.stopping.answers_bank`), under one
accounting: a prompt's cost is the tokens its branches consumed before they ended or were
stopped; the answer is the method's vote. Drawing n of the stored branches is repeated over
seeded shuffles, and every number is reported as a mean and a standard deviation over them
(all methods see the same draws).

    python -m stopexp.answers_replay bank=traces.json n=64 shuffles=100 \
        methods=[no_prune,random,esc,adaptive_consistency,parallel_probe] hydra.run.dir=outputs/replay

The run dir holds metrics.json and pareto.png (conf/answers_replay.yaml). Unset, n is the
bank's branch count (the fewest branches any of its prompts stores), so every stored branch
of such a prompt is drawn. Methods (none needs a hidden state):
- no_prune: all n branches to the end, majority vote (self-consistency, SC@n);
- random: Launch-Check-Resume with a random choice: launch n, at `check_tokens` keep k of
  the running branches at random, finish them, vote (branches ended before the check vote).
  Unset, k = round(sqrt(n)) (as policy.keep from search.n_paths: 8 of 64) and check_tokens
  = 15% of the bank's median branch length (the standard check: 5 of a typical ~33-token
  toy path), so that the check falls inside the paths of any bank;
- every registered stopping method that runs on an answers-only bank (esc, arXiv
  2401.10480; adaptive_consistency, arXiv 2305.11860; parallel_probe, arXiv 2602.03845;
  combined, this project's), with its settings stopping.<method>.<key> (defaults: its
  source's; stopexp/stopping/<module>.py; the replay itself: stopexp/stopping/branch_draws.py).
Answers are voted by cluster of equivalent answers; the replay is also run with the
stored strings and string equality with the gold answer (the published evaluation's
grader), and where the two differ the exact accuracy and the prompts that move are
reported too. shuffler=python draws as Parallel-Probe's simulator does (with seed=0 and
shuffles=100, its very draws).
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from stopexp.core.errors import ConfigError
from stopexp.evaluation import plots
from stopexp.evaluation.table import answers_table
from stopexp.stages.cli import Stage, stage_main
from stopexp.stopping.answers_bank import load_answers_bank
from stopexp.stopping.branch_draws import (build_methods, derived_check_tokens, derived_k, draws,
                                           grader_difference, no_prune_points, replay)


def replay_bank(cfg, out: Path | None = None) -> dict:
    """Load the bank, check the settings its content bounds, replay every method of
    cfg.methods, and (with `out`) draw pareto.png there; returns metrics.json's content. The
    bank is read first (an error about the file comes first): n defaults to its branch
    count, k and check_tokens to values derived from n and the bank."""
    bank = load_answers_bank(cfg.bank, cfg.format)
    n = bank.min_branches if cfg.n is None else cfg.n
    k = derived_k(n) if cfg.k is None else cfg.k
    check_tokens = derived_check_tokens(bank) if cfg.check_tokens is None else cfg.check_tokens
    methods = build_methods(list(cfg.methods), k, check_tokens, cfg.stopping)
    orders = draws(bank, n, cfg.shuffles, cfg.seed, cfg.shuffler)
    if not 1 <= k <= n:
        raise ConfigError(f"k: {k} must be in 1..n={n} (or leave k unset: round(sqrt(n)) = "
                          f"{derived_k(n)})")
    results = replay(bank, methods, orders)
    exact = replay(load_answers_bank(cfg.bank, cfg.format, "exact"), methods, orders)
    points = no_prune_points(bank, n, orders) + [
        {"method": m, "n": n, "k": round(r["branches_launched"], 1), "accuracy": r["accuracy"],
         "tokens_total": r["tokens_total"]} for m, r in results.items() if m != "no_prune"]
    settings = OmegaConf.to_container(cfg, resolve=True)
    protocol = {key: settings[key] for key in ("methods", "shuffles", "seed", "shuffler", "format")}
    protocol |= {"n": n, "k": k, "check_tokens": check_tokens, "source": bank.source,
                 "prompts": len(bank.prompts),
                 "stopping": {m: v for m, v in settings["stopping"].items() if m in cfg.methods}}
    metrics = {"methods": results, "points": points,
               "graders": grader_difference(bank, results, exact), "protocol": protocol}
    if out is not None:
        metrics["plots"] = {"pareto": str(plots.pareto(points, out / "pareto.png"))}
    return metrics


@stage_main("answers_replay", tracked=False)
def main(stage: Stage) -> dict:
    """The replay of the run's config; its table printed, metrics.json in the run dir."""
    metrics = replay_bank(stage.cfg, stage.run_dir)
    print(answers_table(metrics))
    return metrics
