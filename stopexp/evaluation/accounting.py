"""One accounting for every method: the evaluated paths (`Paths`, from the trace bank in
replay), the vote and token cost of a pruning decision (`outcome`), the threshold policy
applied prompt by prompt at one check or several (`decide_by_checks`), the summary and
signal-quality metrics, the Pareto points and the text metrics of the chosen outputs."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from stopexp.core.errors import ConfigError
from stopexp.core.policies import Policy, build_policy
from stopexp.core.voting import elect, rule_score
from stopexp.evaluation.select import lm_scores, pick
from stopexp.metrics import (BertScorer, auprc, bootstrap_ci, is_binary, nonfinite, per_group_auroc,
                             pooled_auroc, reward_ranking, text_metrics, within_prompt_auroc)
from stopexp.stopping.replay import kv_peaks
from stopexp.store import bank, feature_rows
from stopexp.metrics.answers import vote_clusters
from stopexp.store.path_table import Paths, Pruning
from stopexp.tasks.rewards import references

log = logging.getLogger(__name__)


def prompts_in(root: Path, split: str) -> int:
    """How many prompts of `split` the bank holds (prompt ids run 0..n-1)."""
    return int(bank.load_bank(root, split)["prompt_id"][:].max()) + 1


def batches_at(ds, feats, checks: list[int]) -> list[dict]:
    """The predictor batch of every path of `ds` (a bank split) at each check (tokens), in
    order, from its features `feats` (`stopexp.store.feature_rows.load_features` of the same
    split): the one place that reads features for pruning decisions in replay. ValueError
    naming the checks the features lack (add them to tap.checkpoints or tap.positions)."""

    return [feature_rows.tensors_at(ds, feats, c) for c in checks]


def replay_paths(root: Path, features: Path | None, split: str, checkpoint: int | list[int],
                 answer_format: str | None = None) -> Paths:
    """The bank's `split` paths with the predictor batch at `checkpoint` (tokens), or at
    each of several checks (`Paths.checks`; `batch` is the first), joined with their
    `features` (a features directory, `stopexp.store.feature_sets`). Without features the batch
    holds no hidden state or signals (enough for the stopping protocols); `answer_format`:
    the task's `vote_format`. ValueError when the bank holds no such paths or the features
    lack a check."""

    ds = bank.load_bank(root, split)
    if not len(ds):
        raise ConfigError(f"evaluate.split: the trace bank has no {split!r} paths")
    at = [checkpoint] if isinstance(checkpoint, (int, np.integer)) else list(checkpoint)
    if features is not None:
        checks = batches_at(ds, feature_rows.load_features(features, split), at)
    else:
        length = np.asarray(ds["length"][:])
        checks = [{"correct": torch.as_tensor(np.asarray(ds["correct"][:]).astype(np.float32)),
                   "length": torch.as_tensor(length.astype(np.float32)),
                   "alive": torch.as_tensor(length > c)} for c in at]
    t = checks[0]
    t["seed_key"] = [f"{p}/{j}" for p, j in zip(ds["prompt"][:], ds["path_id"][:])]
    t.update(bank.prefix_columns(ds))  # the super token re-encodes the prefixes
    # groups are dense even where collect left prompts out (model.long_prompts=skip)
    prompt_ids, group = np.unique(np.asarray(ds["prompt_id"][:]).astype(np.int64), return_inverse=True)
    t["group"] = torch.as_tensor(group.astype(np.int64))
    for c in checks[1:]:
        c.update({k: t[k] for k in ("seed_key", "prompt", "tokens", "group")})
    return Paths(group=t["group"].numpy(), path_id=np.asarray(ds["path_id"][:]),
                 length=np.asarray(ds["length"][:]), correct=np.asarray(ds["correct"][:]),
                 answer=np.asarray(ds["answer"][:], dtype=object),
                 text=np.asarray(ds["text"][:], dtype=object), alive=t["alive"].numpy(),
                 batch=t, prompt_ids=prompt_ids, prompt_len=np.asarray(ds["prompt_len"][:]),
                 checks=checks, reward=bank.rewards_of(ds).astype(float),
                 lm_score=lm_scores(ds["token_logprob"][:]), answer_format=answer_format,
                 thinking=np.asarray(ds["thinking_tokens"][:]) if "thinking_tokens" in ds.column_names else None)


def bank_paths_and_confs(root: Path, split: str, checkpoint: int, paths: Paths,
                         views) -> tuple[Paths, list]:
    """The bank's paths (`paths` itself in replay) and their per-token confidences, for the
    methods replayed from the bank in either mode."""
    if views is not None:
        paths = replay_paths(root, None, split, checkpoint, paths.answer_format)
    return paths, list(bank.load_bank(root, split)["token_conf"][:])


def prompt_vote(paths: Paths, rows: np.ndarray, signal: np.ndarray | None = None,
                vote: str = "majority", vote_top: float = 0.5) -> tuple[np.ndarray, object]:
    """The clustered answers of one prompt's voting `rows` and the answer they elect (None:
    no voter has one), under `vote` (stopexp.core.voting)."""
    answers = np.asarray(vote_clusters(paths.answer[rows], paths.answer_format), dtype=object)
    return answers, elect([a or None for a in answers], None if signal is None else signal[rows],
                          vote, vote_top)


def outcome(paths: Paths, kept: np.ndarray, checkpoint, n: int, vote: str = "majority",
            signal: np.ndarray | None = None, vote_top: float = 0.5, select: str = "vote") -> dict:
    """Vote, accounting and survival for one pruning decision over the first n paths of
    every prompt. `kept` marks the paths alive at the first check that were never pruned;
    `checkpoint`: the prefix (tokens) where pruned paths stopped, one for all or (P,) per
    path (several checks). `vote`, `signal` (P,) final signals (NaN: never scored) and
    `vote_top`: the vote rule of stopexp.core.voting. `select` other than vote picks one
    finishing path per prompt instead (stopexp/evaluation/select.py; by the final `signal` for
    select=signal); "winner" is each prompt's voted answer, "reward" the chosen output's."""
    use = paths.path_id < n
    voter = use & (~paths.alive | kept)
    stop_at = np.broadcast_to(np.asarray(checkpoint), paths.length.shape)
    spent = np.where(voter, paths.length, np.minimum(paths.length, stop_at)) * use
    G = int(paths.group.max()) + 1
    correct = np.zeros(G, bool)
    chosen = np.full(G, "", dtype=object)
    avg = np.zeros(G)
    reward, avg_reward = np.full(G, np.nan), np.full(G, np.nan)
    winners = np.full(G, None, dtype=object)
    for g in range(G):
        rows = np.nonzero((paths.group == g) & voter)[0]
        answers, winners[g] = prompt_vote(paths, rows, signal, vote, vote_top)
        hit = rows[answers == winners[g]] if winners[g] is not None else rows[:0]
        correct[g] = bool(len(hit)) and bool(paths.correct[hit[0]])
        chosen[g] = paths.text[hit[0]] if len(hit) else (paths.text[rows[0]] if len(rows) else "")
        if select != "vote" and len(rows):
            choice = pick(rows, select, rows[paths.alive[rows]], signal, paths.lm_score, paths.reward)
            hit = np.asarray([choice])
            correct[g], chosen[g] = bool(paths.correct[choice]), paths.text[choice]
        if paths.reward is not None:
            reward[g] = paths.reward[hit[0]] if len(hit) else (paths.reward[rows[0]] if len(rows) else np.nan)
            avg_reward[g] = np.nanmean(paths.reward[rows]) if len(rows) else np.nan
        avg[g] = paths.correct[rows].mean() if len(rows) else 0.0
    per_prompt_tokens = np.bincount(paths.group, weights=spent, minlength=G)
    seq = np.zeros(G)
    np.maximum.at(seq, paths.group, spent)
    steps = np.arange(1, int(paths.length.max()) + 1)
    survival = ((spent[use][:, None] >= steps[None, :]).mean(0)).tolist()
    stopped = use & paths.alive & ~kept
    pruned_at = np.array(stop_at[stopped])
    return {"correct": correct, "chosen": chosen, "winner": winners, "avg": avg, "tokens": per_prompt_tokens,
            "no_path_left": np.bincount(paths.group[voter], minlength=G) == 0,  # every path pruned
            "seq_tokens": seq, "survival": survival, "pruned_at": pruned_at, "stopped": stopped,
            "alive_at_check": float((use & paths.alive).sum() / use.sum()), "spent": spent,
            "kv_peaks": kv_peaks(paths, spent),
            # a thinking model: the tokens spent before each path's end tag (a pruned prefix's share)
            **({"thinking": float(np.minimum(spent, paths.thinking).sum())} if paths.thinking is not None else {}),
            **({"reward": reward, "avg_reward": avg_reward} if paths.reward is not None else {})}


def keep_by_policy(paths: Paths, scores: np.ndarray, policy: Policy, n: int,
                   live: np.ndarray | None = None) -> np.ndarray:
    """Apply the threshold `policy` prompt by prompt to the live paths among the first n
    (`live`: (P,) mask of the paths the check sees; default those alive at the first)."""
    kept = np.zeros(len(scores), bool)
    live = (paths.alive if live is None else live) & (paths.path_id < n)
    for g in range(int(paths.group.max()) + 1):
        rows = np.nonzero((paths.group == g) & live)[0]
        if len(rows):
            kept[rows] = policy.keep(torch.as_tensor(scores[rows])).numpy()
    return kept


def decide_by_checks(paths: Paths, scores: list[np.ndarray], policies: list[Policy],
                     checks: list[int], n: int, rule: str = "last") -> Pruning:
    """Launch-Check-Resume replayed with one check or several (progressive): at check i
    (after checks[i] prefix tokens) the paths still generating and not yet pruned are
    scored (scores[i]: (P,) raw scores of every path there) under `rule` (see
    `rule_score`), and policies[i] keeps its share prompt by prompt. With one check and
    rule `last` this is `keep_by_policy`."""
    first = paths.alive & (paths.path_id < n)
    live = first.copy()
    history = [[] for _ in range(len(live))]
    pruned_at = np.zeros(len(live), np.int64)
    signal = np.full(len(live), np.nan)
    for i, (tokens, policy) in enumerate(zip(checks, policies)):
        if i:
            live &= paths.checks[i]["alive"].numpy().astype(bool)
        now = np.full(len(live), np.nan)
        for r in np.nonzero(live)[0]:
            history[r].append(float(scores[i][r]))
            now[r] = rule_score(history[r], rule)
        signal[live] = now[live]
        kept = keep_by_policy(paths, now, policy, n, live)
        pruned_at[live & ~kept] = tokens
        live &= kept
    return Pruning(kept=first & (pruned_at == 0), pruned_at=pruned_at, signal=signal)


def summarize_outcome(o: dict, seconds_per_token: float, flops_per_token: float, n_boot: int,
              seed: int) -> dict:
    """Accuracy (with its bootstrap CI), tokens, FLOPs and estimated wall time of an
    `outcome` dict."""
    lo, hi = bootstrap_ci(o["correct"].astype(float), n=n_boot, seed=seed)
    tokens = float(o["tokens"].sum())
    return {"accuracy": float(o["correct"].mean()), "accuracy_ci": [lo, hi],
            "avg_at_k": float(o["avg"].mean()), "tokens_total": tokens,
            "seq_tokens": float(o["seq_tokens"].mean()), "flops": tokens * flops_per_token,
            "wall_s": tokens * seconds_per_token, "wall_estimated": True,
            "mean_prune_step": float(o["pruned_at"].mean()) if len(o["pruned_at"]) else None,
            "alive_at_check": o["alive_at_check"],
            **({"thinking_tokens": o["thinking"], "answer_tokens": tokens - o["thinking"]}
               if "thinking" in o else {}),
            # the chosen output's reward, and the mean reward of the paths that finish
            **({"mean_reward": float(np.nanmean(o["reward"])),
                "avg_reward_at_k": float(np.nanmean(o["avg_reward"]))} if "reward" in o else {})}


def signal_quality(paths: Paths, scores: np.ndarray, n: int, n_boot: int, seed: int) -> dict:
    """AUROC (within-prompt, primary; pooled) and AUPRC of a method's scores against path
    success, over the live paths at the check. NaN scores rank lowest and +-inf at the
    extremes (`stopexp.metrics.ranking`); `nonfinite_scores` counts them."""
    live = paths.alive & (paths.path_id < n)
    s, y, g = scores[live], paths.correct[live].astype(float), paths.group[live]
    _, per = per_group_auroc(s, y, g)
    per = per[np.isfinite(per)]
    lo, hi = bootstrap_ci(per, n=n_boot, seed=seed) if len(per) else (np.nan, np.nan)
    ranks = {}
    if paths.reward is not None and not is_binary(paths.reward[live]):  # a continuous reward
        ranks = reward_ranking(s, paths.reward[live], g)
    return {"auroc": within_prompt_auroc(s, y, g), "auroc_ci": [lo, hi],
            "auroc_pooled": pooled_auroc(s, y), "auprc": auprc(s, y),
            "nonfinite_scores": nonfinite(s), **ranks}


def account_methods(names: list[str], scorers: dict, policies: dict, paths: Paths,
                    plan: list[tuple[int, int]], stops: dict, views: dict | None,
                    timing: dict | None, meta: dict, search, policy,
                    evaluate) -> tuple[dict, dict, dict, list]:
    """Score, prune and account every method in `names` on `paths` (N = search.n_paths per
    prompt, keep K of the last check of `plan`, stopexp.core.protocol.check_plan; `search`,
    `policy` and `evaluate`: the config's sections); policies: name -> one threshold policy per check
    (stopexp.core.policies.check_policies, built once by the stage). stops: name -> outcome of the stopping-protocol methods
    (replayed from the bank, or run inside the engine online: those have a `timing`); views/timing: per method the online run's own paths, kept
    set and measured time (None in replay). Returns (results, outcomes, scores, points):
    name -> metrics, name -> `outcome` dict, name -> (P,) scores at the check, and the
    Pareto points of the stopping methods and, with several checks or a threshold policy,
    of the scored methods (the others' come from `pareto_points`). Checks, score rule and
    vote: search.check_at, policy.keep, search.score_rule, evaluate.vote (stopexp.core.protocol.check_plan,
    `decide_by_checks`, stopexp.core.voting); online, views[name] = (the run's paths, its
    `Pruning`, None for no_prune)."""
    N, K = search.n_paths, plan[-1][1]
    topk, n_prompts = policy.name == "topk", int(paths.group.max()) + 1
    vote = dict(vote=evaluate.vote, vote_top=evaluate.vote_top)
    sec_tok = meta.get("seconds_per_token", 0.0)
    flops_tok = 2.0 * meta.get("lm_parameters", 0)
    n_boot, seed = evaluate.bootstrap, evaluate.seed
    results, outcomes, scores, points, ks = {}, {}, {}, [], {}
    all_rows = np.ones(len(paths.length), bool)
    for name in names:
        if name in stops:  # replayed from the bank (exact), or run inside the engine online
            outcomes[name] = stops[name]
            ran = timing.get(name) if timing is not None else None
            results[name] = summarize_outcome(stops[name], sec_tok, flops_tok, n_boot, seed) | (
                {"replayed": True, "check_s": 0.0} if ran is None else {"replayed": False, **ran})
            points.append({"method": name, "n": N, "k": N, "accuracy": results[name]["accuracy"],
                           "tokens_total": results[name]["tokens_total"]})
            continue
        t0 = time.perf_counter()
        if name != "no_prune":  # scores for AUROC (online too); replay also decides by them
            scores[name] = scorers[name](paths.batch).numpy().astype(float)
        if views is not None:  # online: the vote of what the method's own run produced
            view, decision = views[name]
        else:
            view, decision = paths, None
            if name in scores:
                at_checks = [scores[name]] + [scorers[name](b).numpy().astype(float)
                                              for b in paths.checks[1:]]
                decision = decide_by_checks(paths, at_checks, policies[name], [c for c, _ in plan],
                                            N, search.score_rule)
        check_s = time.perf_counter() - t0
        if decision is None:  # no_prune: every path runs to its end, majority vote
            o = outcome(view, all_rows, plan[0][0], N, select=evaluate.select)
        else:
            o = outcome(view, decision.kept, decision.pruned_at, N, signal=decision.signal,
                        select=evaluate.select, **vote)
        outcomes[name] = o
        r = summarize_outcome(o, sec_tok, flops_tok, n_boot, seed)
        r["check_s"] = check_s
        if name in scores:
            r.update(signal_quality(paths, scores[name], N, n_boot, seed))
            # K of a threshold policy: what its rule kept, per prompt on average
            ks[name] = K if topk else round(float(decision.kept.sum()) / n_prompts, 2)
            if len(plan) > 1 or not topk:  # pareto_points' sweep is for one top-K check: this run's point
                points.append({"method": name, "n": N, "k": ks[name], "accuracy": r["accuracy"],
                               "tokens_total": r["tokens_total"]})
        if timing is not None:
            r.update(timing[name])
        results[name] = r
    base = results["no_prune"]
    for name, r in results.items():
        r["tokens_ratio"] = r["tokens_total"] / base["tokens_total"]
        r["tokens_per_s"] = r["tokens_total"] / r["wall_s"] if r["wall_s"] else None
        r["pass_at_1"] = base["avg_at_k"]
        r["n"], r["k"] = N, ks.get(name, K)
    results["no_prune"]["k"] = N
    return results, outcomes, scores, points


def pareto_points(paths: Paths, scores: dict, checkpoint: int, plan: list[tuple[int, int]],
                  search, policy, evaluate) -> list[dict]:
    """The Pareto points at the check of `checkpoint` tokens: no_prune at every N of
    evaluate.n_points, every scored method at every K of evaluate.retention (N =
    search.n_paths), and 32 -> 8, under evaluate.vote; with several checks in `plan` or a
    threshold policy (fixed, quantile, adaptive: no K to sweep) only no_prune's (the
    methods' own come from account_methods)."""
    N = search.n_paths
    points = []
    for n in evaluate.n_points:
        o = outcome(paths, np.ones(len(paths.length), bool), checkpoint, n, select=evaluate.select)
        points.append({"method": "no_prune", "n": n, "k": n, "accuracy": float(o["correct"].mean()),
                       "tokens_total": float(o["tokens"].sum())})
    if len(plan) > 1 or policy.name != "topk":  # account_methods gives each method's point
        return points
    vote = dict(vote=evaluate.vote, vote_top=evaluate.vote_top)
    for name, s in scores.items():
        for n, k in {(N, k) for k in evaluate.retention} | {(min(32, N), min(8, N))}:
            kept = keep_by_policy(paths, s, build_policy(policy, keep=k), n)
            signal = np.where(paths.alive & (paths.path_id < n), s, np.nan)
            o = outcome(paths, kept, checkpoint, n, signal=signal, select=evaluate.select, **vote)
            points.append({"method": name, "n": n, "k": k, "accuracy": float(o["correct"].mean()),
                           "tokens_total": float(o["tokens"].sum())})
    return points


def add_text_metrics(task, split: str, bertscore_model: str | None, prompt_ids: np.ndarray,
                     chosen: dict, results: dict) -> None:
    """BLEU / ROUGE / BERTScore (with evaluate.bertscore_model, None: the default encoder)
    of each method's chosen output (`chosen[name][g]` for the g-th prompt, whose prompt id
    in the task's `split` is `prompt_ids[g]`) against the reference solution (all of them,
    for a task with several) and against the no_prune output."""
    problems = task.problems(split, int(prompt_ids.max()) + 1)
    refs = [references(task, problems[i]) for i in prompt_ids]  # several where the task has them
    refs = [r[0] if len(r) == 1 else r for r in refs]
    scorer = BertScorer(bertscore_model) if bertscore_model else BertScorer()
    chosen = {k: [task.answer_text(h) for h in v] for k, v in chosen.items()}  # thinking: its answer
    base = chosen["no_prune"]
    level = task.text_level
    for name, hyps in chosen.items():
        for key, against in (("text_vs_reference", refs), ("text_vs_no_prune", base)):
            m = results[name][key] = text_metrics(hyps, against, level=level, scorer=scorer,
                                                  tokenize=task.tokenize)
            if m.get("truncated"):
                log.warning("%s %s: BERTScore cut %d of %d outputs at the encoder's maximum "
                            "length (their ends do not count)", name, key, m["truncated"], len(hyps))
