"""The adaptation stream (python -m stopexp.adapt): prompts arrive in batches, each is
pruned by the current predictor, the paths it finishes (kept, explored, or continued by
Monte Carlo rollouts from pruned prefixes) are its feedback, and the predictor takes a few
steps on that feedback before the next batch; replayed from the bank, or run online.

Each batch is pruned with Launch-Check-Resume (N paths, the policy's top K at the check);
the kept paths finish and are graded, and the predictor takes `adapt.steps` AdamW steps
with the training loss (stopexp/training/losses.py) on that feedback, plus `adapt.buffer`
earlier batches of it. In replay a finished path's outcome is looked up in the bank, not
generated; online (stopexp/training/online_lm.py) the LM runs, and since every path has its
own random stream the curves are the same.

Only kept paths reveal their outcome, so kept-only feedback is a sample the predictor's
own decisions biased. With `adapt.explore` = epsilon each would-be-pruned live path is
finished anyway with probability epsilon; it votes like a kept path, its tokens are
counted, and its feedback is weighted by 1 / epsilon (inverse propensity; kept paths are
kept with probability 1) when `adapt.importance_weight`. The costlier second option,
Monte Carlo feedback (variant mc_feedback): after each check, `adapt.mc_prefixes` pruned
prefixes of the batch, drawn at random, are continued `adapt.mc_rollouts` times from the
check; their success rate is the prefix's soft label (the target of reward_regression and
mse; contrastive and pairwise order pairs by it), weighted by 1 / its chance of being drawn.
The rollouts' tokens are a cost (`mc_tokens`, in `tokens`); they do not vote. Replay reads
the rates from the target bank's Monte Carlo labels and estimates their tokens as K x the
path's own remaining length; online forks the check's prefix and counts them.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from stopexp.core.errors import ConfigError
from stopexp.core.names import ONLINE_VARIANTS
from stopexp.core.policies import build_policy
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import keep_by_policy, outcome
from stopexp.metrics import per_group_auroc, within_prompt_auroc

# what the predictors and the losses read (stopexp/signals/feature_spec.py, stopexp/training/losses.py)
FEEDBACK_KEYS = ("hidden", "signals", "prefix_len", "group", "correct", "mc", "remaining")


def take(paths: Paths, groups) -> Paths:
    """The paths of prompts `groups` (in that order), groups renumbered 0..len-1."""
    order = {int(g): i for i, g in enumerate(groups)}
    rows = np.concatenate([np.nonzero(paths.group == g)[0] for g in groups])
    new_group = np.asarray([order[int(g)] for g in paths.group[rows]], dtype=np.int64)
    batch = {k: v[torch.as_tensor(rows)] if torch.is_tensor(v) else [v[i] for i in rows]
             for k, v in paths.batch.items()}
    batch["group"] = torch.as_tensor(new_group)
    return Paths(group=new_group, path_id=paths.path_id[rows], length=paths.length[rows],
                 correct=paths.correct[rows], answer=paths.answer[rows], text=paths.text[rows],
                 alive=paths.alive[rows], batch=batch,
                 prompt_ids=paths.prompt_ids[list(groups)] if paths.prompt_ids is not None else None,
                 answer_format=paths.answer_format)


def stream_order(n_groups: int, stream: int, heldout: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The stream's prompt order and the held-out prompts: a seeded permutation of the
    split's prompts, the first `stream` streamed, the next `heldout` held out."""
    perm = np.random.default_rng(seed).permutation(n_groups)
    if stream + heldout > n_groups:
        raise ConfigError(f"adapt.stream_prompts: {stream} streamed + {heldout} held out exceed the "
                          f"{n_groups} prompts of the bank's split")
    return perm[:stream], perm[stream:stream + heldout]


def feedback(view: Paths, finished: np.ndarray, weight: np.ndarray, offset: int,
             mc: dict | None = None) -> dict:
    """The training batch of what the loop revealed: the paths that finished (live at the
    check) with their outcomes, and the Monte Carlo prefixes `mc` = {"rows", "rate",
    "tokens", "rollouts"} with their success rate as a soft label (`correct` and `mc`) and
    the rollouts' mean length as `remaining`. A finished path's `mc` is NaN (the bank's
    Monte Carlo label is not feedback). Groups are shifted by `offset` so that prompts of
    different batches never pair."""
    use = finished.copy()
    labels = np.full(len(use), np.nan)
    remaining = view.batch["remaining"].numpy().astype(float).copy()
    if mc is not None and len(mc["rows"]):
        use[mc["rows"]] = True
        labels[mc["rows"]] = mc["rate"]
        remaining[mc["rows"]] = mc["tokens"] / mc["rollouts"]
    rows = torch.as_tensor(np.nonzero(use)[0])
    out = {k: view.batch[k][rows] for k in FEEDBACK_KEYS}
    soft = torch.as_tensor(labels[use], dtype=torch.float32)
    out["mc"] = soft
    out["correct"] = torch.where(torch.isnan(soft), out["correct"].float(), soft)
    out["remaining"] = torch.as_tensor(remaining[use], dtype=torch.float32)
    out["group"] = out["group"] + offset
    out["weight"] = torch.as_tensor(weight[use], dtype=torch.float32)
    return out


def concat(batches: list[dict]) -> dict:
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


@torch.no_grad()
def predictor_tensor(predictor, batch: dict) -> torch.Tensor:
    """The predictor's scores of `batch`, in eval mode, without gradients."""
    predictor.eval()
    return predictor(batch)


def predictor_scores(predictor, batch: dict) -> np.ndarray:
    return predictor_tensor(predictor, batch).numpy().astype(float)


def batch_auroc(view: Paths, scores: np.ndarray, n: int) -> float:
    live = view.alive & (view.path_id < n)
    return within_prompt_auroc(scores[live], view.correct[live].astype(float), view.group[live])


def prompt_aurocs(view: Paths, scores: np.ndarray, n: int) -> list[float]:
    """The AUROC of each prompt (group) of `view` over its live paths, NaN where they share
    one outcome or none is alive: the per-prompt values `batch_auroc` averages, for paired
    intervals."""
    live = view.alive & (view.path_id < n)
    out = np.full(int(view.group.max()) + 1, np.nan)
    if live.any():
        keys, values = per_group_auroc(scores[live], view.correct[live].astype(float), view.group[live])
        out[keys] = values
    return out.tolist()


def explore_draws(view: Paths, kept: np.ndarray, epsilon: float, rng, n: int) -> np.ndarray:
    """The would-be-pruned live paths finished anyway: one uniform draw per live path,
    prompt by prompt in path order (the order the online policy sees them in), below
    `epsilon`."""
    explored = np.zeros(len(kept), bool)
    if not epsilon:
        return explored
    live = view.alive & (view.path_id < n)
    for g in range(int(view.group.max()) + 1):
        rows = np.nonzero((view.group == g) & live)[0]
        explored[rows] = ~kept[rows] & (rng.random(len(rows)) < epsilon)
    return explored


def mc_draws(view: Paths, kept: np.ndarray, explored: np.ndarray, count: int, rng,
             n: int) -> tuple[np.ndarray, float]:
    """The pruned live prefixes (among the first n paths of each prompt) continued for Monte
    Carlo feedback: `count` of them uniformly without replacement from `rng` (all when
    fewer), in row order, and the chance each pruned prefix had of being drawn."""
    pruned = np.nonzero(view.alive & (view.path_id < n) & ~kept & ~explored)[0]
    if not len(pruned):
        return pruned, 1.0
    take_n = min(count, len(pruned))
    return np.sort(rng.choice(pruned, size=take_n, replace=False)), take_n / len(pruned)


def replay_continuations(rollouts: int):
    """Monte Carlo continuations from the trace bank: `continue_(view, rows)` -> (success
    rate per row, tokens per row, None). The rates are the bank's `mc` at the check (K =
    `rollouts` = collect.mc_rollouts rollouts); the bank keeps no rollout lengths, so each
    row's tokens are estimated as K x its own remaining length. Raises ValueError naming
    collect.mc_rollouts when the bank has no label there."""
    K = rollouts

    def continue_(view: Paths, rows: np.ndarray):
        rate = view.batch["mc"][torch.as_tensor(rows)].numpy().astype(float)
        if np.isnan(rate).any():
            raise ConfigError("adapt.mc_rollouts: the target bank has no Monte Carlo label at the "
                              "check for some pruned prefixes; collect the target with "
                              f"collect.mc_rollouts={K} (in adapt.target) or use evaluate.mode=online")
        return rate, K * view.batch["remaining"][torch.as_tensor(rows)].numpy().astype(float), None

    return continue_


def replay_decider(paths: Paths, policy, n_paths: int):
    """Prune a batch from the trace bank: the `policy` section's policy (a fresh one per
    batch, K = policy.keep) on the live paths among the first `n_paths` of each prompt.
    Returns (view, scores, kept, explored, measured seconds or None)."""
    N, K = n_paths, policy.keep

    def decide(groups, predictor, epsilon: float, rng):
        view = take(paths, groups)
        if predictor is None:
            return view, None, view.alive & (view.path_id < N), np.zeros(len(view.alive), bool), None
        scores = predictor_scores(predictor, view.batch)
        kept = keep_by_policy(view, scores, build_policy(policy, keep=K), N)
        return view, scores, kept, explore_draws(view, kept, epsilon, rng, N), None

    return decide


def run_stream(predictor, decide, order: np.ndarray, heldout: Paths | None, adapt, loss, *,
               variant: str, n_paths: int, checkpoint: int, seconds_per_token: float,
               continue_=None) -> list[dict]:
    """One variant over the stream, with the settings of the `adapt` section and the
    training `loss` (stopexp.training.losses.build_loss); returns one record per batch.
    `decide` prunes a batch (replay_decider, or stopexp.training.online_lm for the LM in the
    loop); `continue_` runs the Monte Carlo continuations of mc_feedback
    (replay_continuations, or the LM's); `predictor` (None for no_prune) is updated in
    place for the online variants."""
    a, N = adapt, n_paths
    online = variant in ONLINE_VARIANTS
    epsilon = a.explore if variant == "explore" else 0.0
    if variant == "mc_feedback" and continue_ is None:
        raise ValueError("run_stream: the mc_feedback variant needs `continue_`")
    opt = torch.optim.AdamW([p for p in predictor.parameters() if p.requires_grad], lr=a.lr,
                            weight_decay=a.weight_decay) if online and a.steps else None
    rng = np.random.default_rng(a.seed)  # the same exploration draws in every run of a config
    torch.manual_seed(a.seed)
    memory, records = [], []
    before = batch_auroc(heldout, predictor_scores(predictor, heldout.batch), N) \
        if heldout is not None and predictor is not None else None
    for b, start in enumerate(range(0, len(order), a.batch_prompts)):
        t0 = time.perf_counter()
        view, scores, kept, explored, gen_s = decide(order[start:start + a.batch_prompts],
                                                     predictor, epsilon, rng)
        check_s = time.perf_counter() - t0 if gen_s is None else 0.0
        mc = None
        if variant == "mc_feedback":
            rows, chance = mc_draws(view, kept, explored, a.mc_prefixes, rng, N)
            rate, mc_tok, mc_s = continue_(view, rows) if len(rows) else (np.zeros(0), np.zeros(0), 0.0)
            mc = {"rows": rows, "rate": rate, "tokens": mc_tok, "rollouts": a.mc_rollouts,
                  "weight": 1.0 / chance if a.importance_weight else 1.0, "seconds": mc_s}
        o = outcome(view, kept | explored, checkpoint, N)
        extra = np.where(explored, view.length - np.minimum(view.length, checkpoint), 0).sum()
        mc_tokens = float(mc["tokens"].sum()) if mc is not None else 0.0
        rec = {"batch": b, "prompts_seen": start + len(o["correct"]),
               "accuracy": float(o["correct"].mean()), "avg_at_k": float(o["avg"].mean()),
               "tokens": float(o["tokens"].sum()) + mc_tokens, "explore_tokens": float(extra),
               "mc_tokens": mc_tokens, "mc_paths": len(mc["rows"]) if mc is not None else 0,
               "mc_rate": float(mc["rate"].mean()) if mc is not None and len(mc["rows"]) else math.nan,
               "explored_paths": int(explored.sum()), "kept_paths": int(kept.sum()),
               "auroc": batch_auroc(view, scores, N) if scores is not None else math.nan,
               "check_s": check_s, "update_s": 0.0, "loss_first": math.nan, "loss_last": math.nan}
        if opt is not None:
            weight = np.where(explored, 1.0 / epsilon if a.importance_weight else 1.0, 1.0) \
                if epsilon else np.ones(len(kept))
            if mc is not None:
                weight[mc["rows"]] = mc["weight"]
            memory = (memory + [feedback(view, kept | explored, weight, start, mc)])[-(a.buffer + 1):]
            data = concat(memory)
            t1 = time.perf_counter()
            predictor.train()
            losses = []
            for _ in range(a.steps):
                value = loss(predictor(data), data)
                opt.zero_grad(set_to_none=True)
                value.backward()
                opt.step()
                losses.append(value.item())
            rec.update(update_s=time.perf_counter() - t1, loss_first=losses[0], loss_last=losses[-1],
                       feedback_paths=int(len(data["weight"])))
        if heldout is not None and predictor is not None:
            rec["heldout_auroc"] = batch_auroc(heldout, predictor_scores(predictor, heldout.batch), N)
            if b == 0:
                rec["heldout_auroc_before"] = before  # the curve's start, before any feedback
        # replay estimates generation from the bank's seconds per token; online measures it
        gen = rec["tokens"] * seconds_per_token if gen_s is None else gen_s
        if mc is not None and gen_s is not None:  # online: the rollouts' measured seconds
            gen += mc["seconds"] or 0.0
        rec.update(wall_s=gen + rec["check_s"] + rec["update_s"], wall_estimated=gen_s is None)
        records.append(rec)
    return records
