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
  (arXiv 2602.03845): see their modules under stopexp/search/.
"""
from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from stopexp.stopping.answers import AnswersBank, AnswersPrompt, Decision, load_answers_bank, vote_codes
from stopexp.config import derived_keep
from stopexp.core.errors import CannotWrite, ConfigError, reported
from stopexp.stopping.adaptive_consistency import DEFAULT_THRESHOLD, adaptive_consistency
from stopexp.stopping.esc import DEFAULT_WINDOW, esc
from stopexp.stopping.parallel_probe import parallel_probe

Method = Callable[[AnswersPrompt, np.ndarray], Decision]
METHOD_NAMES = ("no_prune", "random", "esc", "adaptive_consistency", "parallel_probe")
# n, k and check_tokens: None = derived from the bank and from n (bank.min_branches,
# derived_k, derived_check_tokens)
DEFAULTS = {"methods": ",".join(METHOD_NAMES), "n": None, "k": None, "check_tokens": None,
            "shuffles": 100, "seed": 0, "format": "boxed", "esc_window": DEFAULT_WINDOW,
            "asc_threshold": DEFAULT_THRESHOLD, "pp_stable": 3, "pp_deviate": 3, "pp_warmup": 2,
            "out": ""}


CHECK_SHARE = 0.15  # check_tokens' default: this share of the median stored branch length


def derived_k(n: int) -> int:
    """k's default: round(sqrt(n)), as policy.keep is derived from search.n_paths."""
    return derived_keep(n)


def derived_check_tokens(bank: AnswersBank) -> int:
    """check_tokens' default: CHECK_SHARE of the median branch length in the bank (>= 1)."""
    lengths = np.concatenate([q.tokens for q in bank.prompts])
    return max(1, round(CHECK_SHARE * float(np.median(lengths))))


def no_prune(prompt: AnswersPrompt, order: np.ndarray) -> Decision:
    """Every branch of `order` to its end; majority vote."""
    return Decision(vote_codes(prompt.final[order]), prompt.tokens[order].copy(), len(order))


def random_keep(prompt: AnswersPrompt, order: np.ndarray, k: int, check_tokens: int) -> Decision:
    """Launch all of `order`, at `check_tokens` keep the first k still running (the order is
    a random draw, so this is a uniform choice), stop the rest there; vote of the finishers."""
    tokens = prompt.tokens[order]
    running = tokens > check_tokens
    kept = running & (np.cumsum(running) <= k)
    voters = ~running | kept
    return Decision(vote_codes(prompt.final[order][voters]),
                    np.where(voters, tokens, check_tokens), len(order))


def build_methods(names: list[str], k: int, check_tokens: int, esc_window: int,
                  asc_threshold: float, pp_stable: int, pp_deviate: int, pp_warmup: int) -> dict:
    """name -> Method for the names in METHOD_NAMES; ConfigError naming an unknown one or
    a method setting out of range."""
    table = {"no_prune": no_prune,
             "random": partial(random_keep, k=k, check_tokens=check_tokens),
             "esc": partial(esc, window=esc_window),
             "adaptive_consistency": partial(adaptive_consistency, threshold=asc_threshold),
             "parallel_probe": partial(parallel_probe, stable=pp_stable, deviate=pp_deviate,
                                       warmup=pp_warmup)}
    unknown = [m for m in names if m not in table]
    if unknown:
        raise ConfigError(f"methods: {', '.join(unknown)} unknown; allowed: {', '.join(METHOD_NAMES)}")
    for key, value, ok, allowed in (("esc_window", esc_window, esc_window >= 1, ">= 1"),
                                    ("asc_threshold", asc_threshold, 0 < asc_threshold <= 1, "in (0, 1]"),
                                    ("pp_stable", pp_stable, pp_stable >= 1, ">= 1"),
                                    ("pp_deviate", pp_deviate, pp_deviate >= 1, ">= 1"),
                                    ("pp_warmup", pp_warmup, pp_warmup >= 0, ">= 0")):
        if not ok:  # before the bank is read, not mid-replay
            raise ConfigError(f"{key}={value}: must be {allowed}")
    return {m: table[m] for m in names}


def draws(bank: AnswersBank, n: int, shuffles: int, seed: int) -> list[list[np.ndarray]]:
    """draws[s][p]: the n branches of prompt p in shuffle s, in sampling order (a seeded
    permutation of the stored branches, the same for every method). The settings are
    checked before what depends on the bank's content (n)."""
    if shuffles < 1:
        raise ConfigError(f"shuffles must be >= 1, got {shuffles}")
    if seed < 0:
        raise ConfigError(f"seed={seed}: must be >= 0 (numpy's seeds are non-negative)")
    if not 1 <= n <= bank.min_branches:
        small = min(range(len(bank.prompts)), key=lambda i: bank.prompts[i].n_branches)
        raise ConfigError(f"n={n} branches per prompt: must be in 1..{bank.min_branches} (prompt "
                          f"{small} of {bank.source} stores {bank.min_branches}; or leave n unset: "
                          "the bank's branch count)")
    return [[np.random.default_rng([seed, s, p]).permutation(q.n_branches)[:n]
             for p, q in enumerate(bank.prompts)] for s in range(shuffles)]


def replay(bank: AnswersBank, methods: dict[str, Method], orders: list[list[np.ndarray]]) -> dict:
    """Per method: accuracy, tokens per prompt and launched branches (mean and std over the
    shuffles), the branches stopped before their end per shuffle (`pruned_paths`) and the
    share of them that would have ended correct (`wrongly_pruned`), and the prompts per
    shuffle whose vote the method turned right or wrong against no_prune on the same draw
    (`vs_no_prune`: improved, worsened)."""
    per = {m: {"acc": [], "tok": [], "launched": [], "stopped": 0, "stopped_right": 0,
               "to_right": 0, "to_wrong": 0} for m in methods}
    for draw in orders:
        for name, method in methods.items():
            acc = tok = launched = 0.0
            for q, order in zip(bank.prompts, draw):
                d = method(q, order)
                right = bool(q.correct[d.answer])
                base = bool(q.correct[vote_codes(q.final[order])])
                acc += right
                tok += float(d.spent.sum())
                launched += d.launched
                cut = d.stopped(q.tokens[order])
                per[name]["stopped"] += int(cut.sum())
                per[name]["stopped_right"] += int(q.correct[q.final[order][cut]].sum())
                per[name]["to_right"] += right and not base
                per[name]["to_wrong"] += base and not right
            P = len(bank.prompts)
            per[name]["acc"].append(acc / P)
            per[name]["tok"].append(tok / P)
            per[name]["launched"].append(launched / P)
    out = {}
    S = len(orders)
    for name, r in per.items():
        out[name] = {"accuracy": float(np.mean(r["acc"])), "accuracy_std": float(np.std(r["acc"])),
                     "tokens_per_prompt": float(np.mean(r["tok"])),
                     "tokens_per_prompt_std": float(np.std(r["tok"])),
                     "tokens_total": float(np.mean(r["tok"])) * len(bank.prompts),
                     "branches_launched": float(np.mean(r["launched"])),
                     "pruned_paths": r["stopped"] / S,
                     "wrongly_pruned": r["stopped_right"] / r["stopped"] if r["stopped"] else None,
                     "vs_no_prune": {"improved": r["to_right"] / S, "worsened": r["to_wrong"] / S}}
    if "no_prune" in out:
        for r in out.values():
            r["tokens_ratio"] = r["tokens_total"] / out["no_prune"]["tokens_total"]
    return out


def no_prune_points(bank: AnswersBank, n: int, orders: list[list[np.ndarray]]) -> list[dict]:
    """no_prune at 1, 2, 4, ... n branches (the first branches of each draw), for the Pareto."""
    points = []
    for m in sorted({*(2 ** i for i in range(n.bit_length())), n}):
        r = replay(bank, {"no_prune": no_prune}, [[o[:m] for o in d] for d in orders])["no_prune"]
        points.append({"method": "no_prune", "n": m, "k": m, "accuracy": r["accuracy"],
                       "tokens_total": r["tokens_total"]})
    return points


def print_table(metrics: dict) -> str:
    p = metrics["protocol"]
    lines = [f"Answers-only replay of {p['source']}: {p['prompts']} prompts, n={p['n']} of the stored "
             f"branches, mean (std) over {p['shuffles']} shuffles; random keeps k={p['k']} at "
             f"{p['check_tokens']} tokens",
             f"{'method':<22}{'accuracy':>9}{'(std)':>8}{'tokens/prompt':>15}{'(std)':>10}"
             f"{'ratio':>7}{'launched':>9}{'wrongly pruned':>15}"]
    for name, r in metrics["methods"].items():
        ws = f"{r['wrongly_pruned']:.3f}" if r["wrongly_pruned"] is not None else "-"
        ratio = f"{r['tokens_ratio']:.2f}" if "tokens_ratio" in r else "-"
        lines.append(f"{name:<22}{r['accuracy']:>9.3f}{r['accuracy_std']:>8.3f}"
                     f"{r['tokens_per_prompt']:>15.0f}{r['tokens_per_prompt_std']:>10.0f}{ratio:>7}"
                     f"{r['branches_launched']:>9.1f}{ws:>15}")
    return "\n".join(lines)


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
        try:
            args[key] = kind(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r}: must be a {kind.__name__}") from None
    args["methods"] = [m for m in args["methods"].strip("[]").split(",") if m]
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
                            args["pp_warmup"])
    if args["check_tokens"] < 1:
        raise ConfigError(f"check_tokens={args['check_tokens']}: must be >= 1")
    orders = draws(bank, n, args["shuffles"], args["seed"])
    if not 1 <= args["k"] <= n:
        raise ConfigError(f"k={args['k']}: must be in 1..n={n} (or leave k unset: "
                          f"round(sqrt(n)) = {derived_k(n)})")
    results = replay(bank, methods, orders)
    points = no_prune_points(bank, args["n"], orders) + [
        {"method": m, "n": args["n"], "k": round(r["branches_launched"], 1), "accuracy": r["accuracy"],
         "tokens_total": r["tokens_total"]} for m, r in results.items() if m != "no_prune"]
    metrics = {"methods": results, "points": points,
               "protocol": {k: v for k, v in args.items() if k not in ("out", "path")}
               | {"source": bank.source, "prompts": len(bank.prompts)}}
    if args["out"]:
        from stopexp.evaluation import plots
        from stopexp.runtime.artifacts import write_json

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
    print(print_table(metrics))
    return metrics


if __name__ == "__main__":
    main()
