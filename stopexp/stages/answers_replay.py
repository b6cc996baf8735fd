"""Replay stopping methods on an answers-only bank (`stopexp.stopping.answers`), under one
accounting: a prompt's cost is the tokens its branches consumed before they ended or were
stopped; the answer is the method's vote. Drawing n of the stored branches is repeated over
seeded shuffles, and every number is reported as a mean and a standard deviation over them
(all methods see the same draws).

    python -m stopexp.answers_replay traces.json n=64 shuffles=100 \
        methods=no_prune,random,esc,adaptive_consistency,parallel_probe out=outputs/replay

Unset, n is the bank's branch count (the fewest branches any of its prompts stores), so
every stored branch of such a prompt is drawn. Methods (none needs a hidden state):
- no_prune: all n branches to the end, majority vote (self-consistency, SC@n);
- random: Launch-Check-Resume with a random choice: launch n, at `check_tokens` keep k of
  the running branches at random, finish them, vote (branches ended before the check vote).
  Unset, k = round(sqrt(n)) (as policy.keep from search.n_paths: 8 of 64) and check_tokens
  = 15% of the bank's median branch length (the standard check: 5 of a typical ~33-token
  toy path), so that the check falls inside the paths of any bank;
- esc (arXiv 2401.10480), adaptive_consistency (arXiv 2305.11860), parallel_probe
  (arXiv 2602.03845): see their modules under stopexp/stopping/ (the replay itself:
  stopexp/stopping/branch_draws.py); their defaults are the published settings;
- combined: consensus and each branch's answer stability together, in waves
  (stopexp/stopping/combined.py; knobs combined_first, combined_wave, combined_threshold,
  combined_settle, combined_prune_below, combined_prune_confidence, chosen on AIME24 by
  scripts/tune_combined.py).
Answers are voted by cluster of equivalent answers; the replay is also run with the
stored strings and string equality with the gold answer (the published evaluation's
grader), and where the two differ the exact accuracy and the prompts that move are
reported too. shuffler=python draws as Parallel-Probe's simulator does (with seed=0 and
shuffles=100, its very draws).
"""
from __future__ import annotations

import sys
from pathlib import Path

from stopexp.config.paths import probe_writable
from stopexp.core.errors import CannotWrite, ConfigError, reported, writing
from stopexp.evaluation import plots
from stopexp.evaluation.table import answers_table
from stopexp.runtime.artifacts import write_json
from stopexp.stopping import combined as cb
from stopexp.stopping import parallel_probe as pp
from stopexp.stopping.adaptive_consistency import DEFAULT_THRESHOLD
from stopexp.stopping.answers import load_answers_bank
from stopexp.stopping.branch_draws import (METHOD_NAMES, build_methods, derived_check_tokens,
                                           derived_k, draws, grader_difference, no_prune_points,
                                           replay)
from stopexp.stopping.esc import DEFAULT_WINDOW

# n, k and check_tokens: None = derived from the bank and from n (bank.min_branches,
# derived_k, derived_check_tokens)
DEFAULTS = {"methods": ",".join(METHOD_NAMES), "n": None, "k": None, "check_tokens": None,
            "shuffles": 100, "seed": 0, "shuffler": "numpy", "format": "boxed",
            "esc_window": DEFAULT_WINDOW, "asc_threshold": DEFAULT_THRESHOLD,
            **{f"pp_{k}": v for k, v in pp.DEFAULTS.items()},
            **{f"combined_{k}": v for k, v in cb.DEFAULTS.items()}, "out": ""}
BOOLS = {"true": True, "false": False}


def parse_args(argv: list[str]) -> dict:
    """`PATH key=value ...` -> settings (DEFAULTS filled in); ValueError naming a bad key."""
    paths = [a for a in argv if "=" not in a]
    if len(paths) != 1:
        raise ConfigError(f"give exactly one answers-only bank (a .json file), got {paths or 'none'}")
    args = dict(DEFAULTS, path=paths[0])
    for a in argv:
        if "=" not in a:
            continue
        key, value = a.split("=", 1)
        if key not in DEFAULTS:
            raise ConfigError(f"{key}: unknown setting; allowed: {', '.join(DEFAULTS)}")
        kind = int if key in ("n", "k", "check_tokens") else type(DEFAULTS[key])
        if kind is bool:
            if value.lower() not in BOOLS:
                raise ConfigError(f"{key}={value!r}: must be true or false")
            args[key] = BOOLS[value.lower()]
            continue
        try:
            args[key] = kind(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r}: must be a {kind.__name__}") from None
    given = args["methods"]
    args["methods"] = [m.strip() for m in given.strip("[]").split(",") if m.strip()]
    if not args["methods"]:  # nothing to replay: the table would be empty
        raise ConfigError(f"methods={given!r}: give at least one method; allowed: "
                          f"{', '.join(METHOD_NAMES)} (unset: all of them)")
    return args


def run(args: dict) -> dict:
    """Load, check every setting, replay, and (with `out`) write metrics.json and pareto.png.
    The bank is read first (an error about the file comes first), then the settings that do
    not depend on its content, then those that do: n defaults to its branch count, k and
    check_tokens to values derived from n and the bank."""
    bank = load_answers_bank(args["path"], args["format"])
    n = bank.min_branches if args["n"] is None else args["n"]
    args = {**args, "n": n, "k": derived_k(n) if args["k"] is None else args["k"],
            "check_tokens": (derived_check_tokens(bank) if args["check_tokens"] is None
                             else args["check_tokens"])}
    methods = build_methods(args["methods"], args["k"], args["check_tokens"], args["esc_window"],
                            args["asc_threshold"], args["pp_stable"], args["pp_deviate"],
                            args["pp_warmup"], args["pp_vote_pruned"],
                            {k: args[f"combined_{k}"] for k in cb.DEFAULTS})
    if args["check_tokens"] < 1:
        raise ConfigError(f"check_tokens={args['check_tokens']}: must be >= 1")
    orders = draws(bank, n, args["shuffles"], args["seed"], args["shuffler"])
    if not 1 <= args["k"] <= n:
        raise ConfigError(f"k={args['k']}: must be in 1..n={n} (or leave k unset: "
                          f"round(sqrt(n)) = {derived_k(n)})")
    if args["out"]:
        # checked before the replay, so an unwritable out costs no compute
        with writing(Path(args["out"]) / "pareto.png"):
            probe_writable(Path(args["out"]))
    results = replay(bank, methods, orders)
    exact = replay(load_answers_bank(args["path"], args["format"], "exact"), methods, orders)
    graders = grader_difference(bank, results, exact)
    points = no_prune_points(bank, args["n"], orders) + [
        {"method": m, "n": args["n"], "k": round(r["branches_launched"], 1), "accuracy": r["accuracy"],
         "tokens_total": r["tokens_total"]} for m, r in results.items() if m != "no_prune"]
    metrics = {"methods": results, "points": points, "graders": graders,
               "protocol": {k: v for k, v in args.items() if k not in ("out", "path")}
               | {"source": bank.source, "prompts": len(bank.prompts)}}
    if args["out"]:
        out = Path(args["out"])
        metrics["plots"] = {"pareto": str(plots.pareto(points, out / "pareto.png"))}
        write_json(out / "metrics.json", metrics)
    return metrics


def main(argv: list[str] | None = None) -> dict:
    """A bad setting, a missing or broken bank, an `out` that cannot be written: one
    `error:` line and exit code 2 (stopexp.core.errors)."""
    with reported():
        try:
            metrics = run(parse_args(sys.argv[1:] if argv is None else argv))
        except CannotWrite as e:
            e.setting = "out"
            raise
    print(answers_table(metrics))
    return metrics


if __name__ == "__main__":
    main()
