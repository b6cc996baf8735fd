"""Paired statistics behind every comparison of the probe with a control: for each learned
method (the probe) against each control (confidence, conf_features, and the best
non-learned signal), the paired bootstrap over prompts (`stopexp.metrics.paired_difference`)
of the within-prompt AUROC difference at every check (and every prefix of
`auroc_by_prefix`) and of the vote-accuracy difference of the run's decision (the same
kept K). A "beats" claim needs an interval that excludes 0.

Both methods are scored on the same live paths of the same prompts, so a prompt whose
live paths all end right or all end wrong has no AUROC for either: it is left out of the
AUROC differences and counted (`excluded_prompts`); the accuracy difference uses every
prompt. The best non-learned signal is the non-learned score (confidence, entropy, the
hidden-state statistics, ...; not random or oracle) with the highest within-prompt AUROC
at that check or prefix on these prompts: chosen on the test prompts themselves, so the
control is as strong as these signals get, never weaker.
"""
from __future__ import annotations

import numpy as np

from stopexp.core.names import BASELINE_METHODS, lookup, predictor_names, runs_the_lm
from stopexp.metrics import paired_difference, per_group_auroc
from stopexp.metrics.multiplicity import ALPHA, correct_family, holm

CONTROLS = ("confidence", "conf_features", "best_non_learned")


def role_label(role: str) -> str:
    """How tables and figures name a control role."""
    return "best non-learned" if role == "best_non_learned" else role


def in_order(roles) -> list[str]:
    """The control roles of `roles` in CONTROLS order (metrics.json sorts its keys)."""
    return [r for r in CONTROLS if r in roles]


def is_probe(name: str) -> bool:
    """A predictor of the hidden state (its class's `inputs` hold it, or it runs the LM),
    not a control such as conf_features, which reads the confidence columns only; or the
    single-checkpoint predictor of the prefix curves ("<predictor>@<tokens>")."""
    if "@" in name:
        return True
    if name not in predictor_names():
        return False
    return runs_the_lm(name) or "hidden" in lookup("predictor", name).inputs


def best_non_learned(mean_auroc: dict) -> str | None:
    """The non-learned signal of `mean_auroc` (name -> within-prompt AUROC) that ranks best;
    None when none was evaluated or none has an AUROC."""
    finite = {m: a for m, a in mean_auroc.items() if m in BASELINE_METHODS and np.isfinite(a)}
    return max(finite, key=finite.get) if finite else None


def roles_of(names) -> list[str]:
    """The control roles a run has: confidence and conf_features where evaluated, the best
    non-learned signal where any non-learned signal was."""
    return [r for r in CONTROLS[:2] if r in names] + (
        ["best_non_learned"] if any(m in BASELINE_METHODS for m in names) else [])


def compare(per_prompt: dict, roles: dict, n_boot: int, seed: int) -> dict:
    """probe -> control role -> `paired_difference` of the probe's and the control's
    per-prompt values (`per_prompt`: method -> (G,) over the same prompts; a role whose
    method is None, no signal having an AUROC there, gets NaN)."""
    G = len(next(iter(per_prompt.values())))
    missing = np.full(G, np.nan)
    return {p: {role: paired_difference(per_prompt[p], per_prompt.get(m, missing), n_boot, seed)
                for role, m in roles.items()}
            for p in per_prompt if is_probe(p)}


def at_check(scores: dict, correct, group, prompts: np.ndarray, n_boot: int, seed: int) -> dict:
    """One check's (or prefix's) AUROC differences: `scores` method -> scores of the live
    paths there, `correct`/`group` theirs, `prompts` every prompt's group key (a prompt
    without a live path there counts as excluded). Returns {"mixed_prompts",
    "excluded_prompts", "best_non_learned", "auroc_diff"}."""
    per = {}
    for name, s in scores.items():
        keys, values = per_group_auroc(s, correct, group)
        per[name] = np.full(len(prompts), np.nan)
        per[name][np.searchsorted(prompts, keys)] = values
    mean = {m: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for m, v in per.items()}
    best = best_non_learned(mean)
    roles = {r: (best if r == "best_non_learned" else r) for r in roles_of(scores)}
    mixed = int(np.isfinite(next(iter(per.values()))).sum()) if per else 0
    return {"mixed_prompts": mixed, "excluded_prompts": len(prompts) - mixed,
            "best_non_learned": best, "auroc_diff": compare(per, roles, n_boot, seed)}


def scores_at_checks(scorers: dict, scores: dict, paths) -> list[dict]:
    """method -> (P,) scores at every check: `scores` (the first check's, as accounted)
    and, in replay with several checks, each scorer on the later checks' batches."""
    later = paths.checks[1:] if paths.checks else []
    return [scores] + [{m: scorers[m](b).numpy().astype(float) for m in scores} for b in later]


def paired_stats(paths, check_scores: list[dict], plan: list, n: int, outcomes: dict,
                 n_boot: int, seed: int) -> dict:
    """metrics.json's "paired": per check of `plan` ((tokens, K) each) the AUROC
    differences over the paths alive there among the first n of every prompt
    (`check_scores[i]`: method -> (P,) scores of every path at check i; online only the
    first check has them), and the vote-accuracy differences of the run (`outcomes`:
    method -> outcome dict, "correct" per prompt), against the best non-learned signal of
    the first check. Every difference carries its bootstrap p-value and Holm's adjusted
    one over all of them (one family: `holm_family` tests; `correct_family`). {} without a
    probe."""
    if not any(is_probe(m) for m in check_scores[0]):
        return {}
    G = int(paths.group.max()) + 1
    checks = []
    for i, scores in enumerate(check_scores):
        alive = paths.alive if i == 0 else paths.checks[i]["alive"].numpy().astype(bool)
        live = alive & (paths.path_id < n)
        row = at_check({m: s[live] for m, s in scores.items()}, paths.correct[live],
                       paths.group[live], np.arange(G), n_boot, seed)
        checks.append({"tokens": int(plan[i][0]), "k": plan[i][1], **row})
    first = checks[0]
    roles = {r: r for r in CONTROLS[:2] if r in outcomes}
    if first["best_non_learned"] in outcomes:
        roles["best_non_learned"] = first["best_non_learned"]
    correct = {m: o["correct"].astype(float) for m, o in outcomes.items()
               if m in roles.values() or is_probe(m)}
    accuracy = compare(correct, roles, n_boot, seed)
    cells = [d for c in checks for by_role in c["auroc_diff"].values() for d in by_role.values()]
    m = correct_family(cells + [d for by_role in accuracy.values() for d in by_role.values()])
    return {"bootstrap": n_boot, "seed": seed, "level": 0.95, "prompts": G, "checks": checks,
            "accuracy_best_non_learned": roles.get("best_non_learned"),
            "accuracy_diff": accuracy, "holm_family": m}


def by_prefix(scores: dict, correct, group, position, n_boot: int, seed: int) -> dict:
    """The AUROC differences at every stored prefix (the position batch's rows: `scores`
    method -> (B,), `correct`, `group` the prompt, `position`), as lists over the sorted
    positions: {"positions", "mixed_prompts", "excluded_prompts", "best_non_learned",
    "auroc_diff": probe -> role -> {"diff": [...], "ci": [[lo, hi], ...], "p": [...],
    "p_holm": [...], "holm": [...]}}, Holm's correction over the prefixes of one probe and
    control (a family each; "holm" True where it survives at 0.05). {} without a probe."""
    if not any(is_probe(m) for m in scores):
        return {}
    correct, group, position = np.asarray(correct) > 0.5, np.asarray(group), np.asarray(position)
    prompts = np.unique(group)
    out = {"positions": [], "mixed_prompts": [], "excluded_prompts": [], "best_non_learned": [],
           "auroc_diff": {}}
    for p in np.unique(position):
        at = position == p
        row = at_check({m: np.asarray(s, float)[at] for m, s in scores.items()}, correct[at],
                       group[at], prompts, n_boot, seed)
        out["positions"].append(int(p))
        for key in ("mixed_prompts", "excluded_prompts", "best_non_learned"):
            out[key].append(row[key])
        for probe, by_role in row["auroc_diff"].items():
            for role, d in by_role.items():
                series = out["auroc_diff"].setdefault(probe, {}).setdefault(
                    role, {"diff": [], "ci": [], "p": []})
                series["diff"].append(d["diff"])
                series["ci"].append(d["ci"])
                series["p"].append(d["p"])
    for roles in out["auroc_diff"].values():
        for series in roles.values():  # a family per probe and control: its prefixes
            adjusted = holm(series["p"])
            series["p_holm"] = adjusted.tolist()
            series["holm"] = [bool(a <= ALPHA) for a in adjusted]
    return out


def combined_pairs(outcomes: dict, n_boot: int, seed: int) -> dict:
    """The combined controller against Adaptive-Consistency and each probe (the consensus
    alone and the signal alone): per method the paired bootstrap over prompts of the
    vote-accuracy and the token differences (combined - it). {} without combined."""
    if "combined" not in outcomes:
        return {}
    c = outcomes["combined"]
    return {m: {"accuracy": paired_difference(c["correct"].astype(float), o["correct"].astype(float),
                                              n_boot, seed),
                "tokens": paired_difference(c["tokens"], o["tokens"], n_boot, seed)}
            for m, o in outcomes.items() if m == "adaptive_consistency" or is_probe(m)}
