"""Stopping methods replayed on an answers-only bank: n of each prompt's stored branches
drawn over seeded shuffles (every method sees the same draws), each method's decision per
draw, and its accuracy and tokens as a mean and a standard deviation over the draws."""
from __future__ import annotations

import random
from functools import partial
from typing import Callable

import numpy as np

from stopexp.core.errors import ConfigError
from stopexp.core.names import lookup, names
from stopexp.core.protocol import derived_keep
from stopexp.stopping.answers_bank import AnswersBank, AnswersPrompt, Decision, vote_codes

Method = Callable[[AnswersPrompt, np.ndarray], Decision]
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


def method_names() -> tuple[str, ...]:
    """The methods an answers-only bank replays: no_prune, random and every registered
    stopping method that runs on one (stopexp.core.names REGISTRY["stopping"])."""
    return ("no_prune", "random",
            *(m for m in names("stopping") if "answers" in lookup("stopping", m).banks))


def build_methods(methods: list[str], k: int, check_tokens: int, stopping=None) -> dict:
    """name -> Method for `methods` (of `method_names`): random with k and check_tokens, a
    stopping method with its settings `stopping[name]` (answers_replay's stopping.<name>;
    missing: its defaults). ConfigError naming an unknown method or a setting out of range
    (stopping.<name>.<key>), before the bank is read."""
    allowed = method_names()
    unknown = [m for m in methods if m not in allowed]
    if unknown:
        raise ConfigError(f"methods: {', '.join(unknown)} unknown; allowed: {', '.join(allowed)}")
    stopping = stopping or {}
    table: dict[str, Method] = {}
    for m in methods:
        if m == "no_prune":
            table[m] = no_prune
        elif m == "random":
            table[m] = partial(random_keep, k=k, check_tokens=check_tokens)
        else:
            method = lookup("stopping", m).of(stopping[m] if m in stopping else None)
            method.check(f"stopping.{m}")
            table[m] = method.decide
    return table


SHUFFLERS = ("numpy", "python")


def permutation(size: int, seed: int, s: int, p: int, shuffler: str) -> np.ndarray:
    """Shuffle s of prompt p's `size` stored branches: numpy's generator seeded with
    (seed, s, p), or (shuffler="python") `random.Random(seed + s).shuffle`, the draws of
    Parallel-Probe's simulator (evaluation/data_loader.py: seeds 0..99, one per shuffle,
    the same for every prompt)."""
    if shuffler == "numpy":
        return np.random.default_rng([seed, s, p]).permutation(size)
    idx = list(range(size))
    random.Random(seed + s).shuffle(idx)
    return np.asarray(idx)


def draws(bank: AnswersBank, n: int, shuffles: int, seed: int,
          shuffler: str = "numpy") -> list[list[np.ndarray]]:
    """draws[s][p]: the n branches of prompt p in shuffle s, in sampling order (the first n
    of a seeded permutation of the stored branches, `permutation`; the same for every
    method). The settings are checked before what depends on the bank's content (n)."""
    if shuffles < 1:
        raise ConfigError(f"shuffles must be >= 1, got {shuffles}")
    if seed < 0:
        raise ConfigError(f"seed={seed}: must be >= 0 (numpy's seeds are non-negative)")
    if shuffler not in SHUFFLERS:
        raise ConfigError(f"shuffler={shuffler!r} unknown; allowed: {', '.join(SHUFFLERS)}")
    if not 1 <= n <= bank.min_branches:
        small = min(range(len(bank.prompts)), key=lambda i: bank.prompts[i].n_branches)
        raise ConfigError(f"n={n} branches per prompt: must be in 1..{bank.min_branches} (prompt "
                          f"{small} of {bank.source} stores {bank.min_branches}; or leave n unset: "
                          "the bank's branch count)")
    return [[permutation(q.n_branches, seed, s, p, shuffler)[:n] for p, q in enumerate(bank.prompts)]
            for s in range(shuffles)]


def replay(bank: AnswersBank, methods: dict[str, Method], orders: list[list[np.ndarray]]) -> dict:
    """Per method: accuracy, tokens per prompt and launched branches (mean and std over the
    shuffles), the branches stopped before their end per shuffle (`pruned_paths`) and the
    share of them that would have ended correct (`wrongly_pruned`), and the prompts per
    shuffle whose vote the method turned right or wrong against no_prune on the same draw
    (`vs_no_prune`: improved, worsened), and each prompt's accuracy over the shuffles
    (`prompt_accuracy`)."""
    per = {m: {"acc": [], "tok": [], "launched": [], "stopped": 0, "stopped_right": 0,
               "to_right": 0, "to_wrong": 0, "hits": np.zeros(len(bank.prompts))} for m in methods}
    for draw in orders:
        for name, method in methods.items():
            acc = tok = launched = 0.0
            for i, (q, order) in enumerate(zip(bank.prompts, draw)):
                d = method(q, order)
                right = bool(q.correct[d.answer])
                per[name]["hits"][i] += right
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
                     "vs_no_prune": {"improved": r["to_right"] / S, "worsened": r["to_wrong"] / S},
                     "prompt_accuracy": (r["hits"] / S).tolist()}
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


def grader_difference(bank, results: dict, exact: dict) -> dict:
    """Where voting and grading by stored string (`exact`) differs from the equivalence of
    the answers: per method the exact accuracy and tokens, and the prompts whose accuracy over the
    shuffles moves ({"prompt", "gold", method: [equivalent, exact]})."""
    moved = []
    for i, q in enumerate(bank.prompts):
        row = {m: [results[m]["prompt_accuracy"][i], exact[m]["prompt_accuracy"][i]] for m in results}
        if any(a != b for a, b in row.values()):
            moved.append({"prompt": i, "gold": q.gold, **row})
    return {"accuracy_exact": {m: r["accuracy"] for m, r in exact.items()},
            "tokens_per_prompt_exact": {m: r["tokens_per_prompt"] for m, r in exact.items()},
            "moved": moved}
