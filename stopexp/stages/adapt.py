"""Online fine-tuning of the signal predictor from pruning feedback, under a distribution shift.

    python -m stopexp.adapt +exp=toy_shift
    python -m stopexp.adapt +exp=toy_shift adapt.explore=0.2 adapt.lr=3e-3 adapt.buffer=0

The predictor learned the source config; the prompts arrive from the target, the config
with `adapt.target`'s keys in place (`{task.operators: [+, -]}`, or an LM update such as
`{task.styles: {careful: 0.8, shortcut: 0.2}, model.toy.seed: 1}`). The stream is `adapt.stream_prompts`
prompts of the target bank's `adapt.split` in a seeded order, cut into batches of
`adapt.batch_prompts`. Each batch is pruned by the current predictor with Launch-Check-
Resume (N = search.n_paths, top K = policy.keep at search.check_at); the kept paths finish
and are graded, and the predictor takes `adapt.steps` AdamW steps with the training loss
(stopexp/training/losses.py) on that feedback, plus `adapt.buffer` earlier batches of it, before the
next batch arrives. By default everything is replayed from the trace bank: a finished
path's outcome is looked up, not generated, so a run costs seconds; `evaluate.mode=online`
runs the target LM instead (stopexp/training/online.py) and gives the same curves, since
every path has its own random stream.

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
the rates from the target bank's Monte Carlo labels (`collect.mc_rollouts` in
`adapt.target`) and estimates their tokens as K x the path's own remaining length;
online forks the check's prefix (stopexp/training/online.py) and counts them.

Variants (`adapt.variants`): no_prune (every path finishes), frozen (the source
predictor), kept_only, explore and mc_feedback (online updates from the source predictor), retrained
(a predictor trained offline on the target bank's train split: the ceiling). Per batch:
within-prompt AUROC of the scores that pruned it, vote accuracy, tokens (exploration
included), estimated wall seconds (tokens x the bank's seconds per token, plus the measured
check and update time), and the within-prompt AUROC on `adapt.heldout_prompts` further
target prompts after the update (the cleaner learning curve).
"""
from __future__ import annotations

import copy
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from stopexp.store import bank
from stopexp.evaluation import plots
from stopexp.runtime.artifacts import write_json
from stopexp.runtime.cli import stage_main
from stopexp.config import check_output_dirs, checkpoint_tokens, shifted_config, validate
from stopexp.evaluation.accounting import Paths, keep_by_policy, outcome, replay_paths
from stopexp.core.errors import ConfigError
from stopexp.training.losses import build_loss
from stopexp.core.policies import kept_text, policy_params
from stopexp.tasks import vote_format
from stopexp.metrics import within_prompt_auroc
from stopexp.runtime.tracking import tracked_run

log = logging.getLogger(__name__)
ONLINE = ("kept_only", "explore", "mc_feedback")
# what the predictors and the losses read (stopexp/signals/features.py, stopexp/training/losses.py)
FEEDBACK_KEYS = ("hidden", "signals", "prefix_len", "group", "correct", "mc", "remaining")


# ---- the shift ---------------------------------------------------------------------------

def target_config(cfg) -> DictConfig:
    """The stream's config: `cfg` with each `adapt.target` key (a dotted config key under
    task, model or search) set to its value. For the toy LM, task keys are pinned to the
    source task (`model.toy.train_task`) when `adapt.pin_lm`, so the target bank is made by
    the same LM, which never saw the target task; without it the LM is the one trained on
    the target (a style mix, `task.styles`, only changes the LM: pinned, it shifts nothing)."""
    tgt = shifted_config(cfg)
    if cfg.adapt.pin_lm and cfg.model.name == "toy" and cfg.model.toy is not None:
        from stopexp.models.toy_lm import ARITH_KEYS

        source = OmegaConf.to_container(cfg.task, resolve=True)
        pinned = {k[5:]: source[k[5:]] for k in cfg.adapt.target
                  if k.startswith("task.") and k[5:] in ARITH_KEYS}
        with open_dict(tgt):
            tgt.model.toy.train_task = {**pinned, **dict(cfg.model.toy.train_task)}
    return tgt


def _value(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_value(x)}" for k, x in v.items()) + "}"
    return f"'{v}'" if isinstance(v, str) else str(v)


def target_overrides(cfg, overrides: list[str]) -> list[str]:
    """The command-line overrides that compose the target bank's config (for the collect
    and train commands printed when it or its predictor is missing)."""
    out = [o for o in overrides if not o.lstrip("+~").startswith("adapt.")]  # also ++adapt.target=...
    tgt = target_config(cfg)
    out += [f'"{k}={_value(OmegaConf.to_container(cfg.adapt.target, resolve=True)[k])}"'
            for k in cfg.adapt.target]
    if cfg.model.name == "toy":
        out += [f'"+model.toy.train_task.{k}={_value(v)}"'
                for k, v in OmegaConf.to_container(tgt.model.toy.train_task).items()
                if k not in cfg.model.toy.train_task]
    return out


# ---- the stream --------------------------------------------------------------------------

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
def _scores(predictor, batch: dict) -> np.ndarray:
    predictor.eval()
    return predictor(batch).numpy().astype(float)


def _auroc(view: Paths, scores: np.ndarray, n: int) -> float:
    live = view.alive & (view.path_id < n)
    return within_prompt_auroc(scores[live], view.correct[live].astype(float), view.group[live])


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


def replay_continuations(cfg):
    """Monte Carlo continuations from the trace bank: `continue_(view, rows)` -> (success
    rate per row, tokens per row, None). The rates are the bank's `mc` at the check (K =
    collect.mc_rollouts rollouts); the bank keeps no rollout lengths, so each row's tokens
    are estimated as K x its own remaining length. Raises ValueError naming
    collect.mc_rollouts when the bank has no label there."""
    K = cfg.adapt.mc_rollouts

    def continue_(view: Paths, rows: np.ndarray):
        rate = view.batch["mc"][torch.as_tensor(rows)].numpy().astype(float)
        if np.isnan(rate).any():
            raise ConfigError("adapt.mc_rollouts: the target bank has no Monte Carlo label at the "
                              "check for some pruned prefixes; collect the target with "
                              f"collect.mc_rollouts={K} (in adapt.target) or use evaluate.mode=online")
        return rate, K * view.batch["remaining"][torch.as_tensor(rows)].numpy().astype(float), None

    return continue_


def replay_decider(paths: Paths, cfg):
    """Prune a batch from the trace bank: (view, scores, kept, explored, measured seconds
    or None)."""
    N, K = cfg.search.n_paths, cfg.policy.keep

    def decide(groups, predictor, epsilon: float, rng):
        view = take(paths, groups)
        if predictor is None:
            return view, None, view.alive & (view.path_id < N), np.zeros(len(view.alive), bool), None
        scores = _scores(predictor, view.batch)
        kept = keep_by_policy(view, scores, cfg, K, N)
        return view, scores, kept, explore_draws(view, kept, epsilon, rng, N), None

    return decide


def run_stream(predictor, decide, order: np.ndarray, heldout: Paths | None, cfg, *,
               variant: str, checkpoint: int, seconds_per_token: float,
               continue_=None) -> list[dict]:
    """One variant over the stream; returns one record per batch. `decide` prunes a batch
    (replay_decider, or stopexp.training.online for the LM in the loop); `continue_` runs the
    Monte Carlo continuations of mc_feedback (replay_continuations, or the LM's);
    `predictor` (None for no_prune) is updated in place for the online variants."""
    a, N = cfg.adapt, cfg.search.n_paths
    online = variant in ONLINE
    epsilon = a.explore if variant == "explore" else 0.0
    if variant == "mc_feedback" and continue_ is None:
        raise ValueError("run_stream: the mc_feedback variant needs `continue_`")
    loss_fn = build_loss(cfg.loss)
    opt = torch.optim.AdamW([p for p in predictor.parameters() if p.requires_grad], lr=a.lr,
                            weight_decay=a.weight_decay) if online and a.steps else None
    rng = np.random.default_rng(a.seed)  # the same exploration draws in every run of a config
    torch.manual_seed(a.seed)
    memory, records = [], []
    before = _auroc(heldout, _scores(predictor, heldout.batch), N) \
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
               "auroc": _auroc(view, scores, N) if scores is not None else math.nan,
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
                loss = loss_fn(predictor(data), data)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            rec.update(update_s=time.perf_counter() - t1, loss_first=losses[0], loss_last=losses[-1],
                       feedback_paths=int(len(data["weight"])))
        if heldout is not None and predictor is not None:
            rec["heldout_auroc"] = _auroc(heldout, _scores(predictor, heldout.batch), N)
            if b == 0:
                rec["heldout_auroc_before"] = before  # the curve's start, before any feedback
        # replay estimates generation from the bank's seconds per token; online measures it
        gen = rec["tokens"] * seconds_per_token if gen_s is None else gen_s
        if mc is not None and gen_s is not None:  # online: the rollouts' measured seconds
            gen += mc["seconds"] or 0.0
        rec.update(wall_s=gen + rec["check_s"] + rec["update_s"], wall_estimated=gen_s is None)
        records.append(rec)
    return records


# ---- the stage ---------------------------------------------------------------------------

def load_predictors(cfg, tgt, overrides: list[str]) -> dict:
    """The source predictor (trained on the source bank) and the ceiling (trained on the
    target bank), each trained here when missing, like train would."""
    from stopexp.signals.checkpoint import load_predictor
    from stopexp.store.features import spec_of
    from stopexp.stages.train import train

    out = {}
    for name, c, ov in (("frozen", cfg, overrides), ("retrained", tgt, target_overrides(cfg, overrides))):
        if name == "retrained" and "retrained" not in cfg.adapt.variants:
            continue
        root = bank.require_bank(c, ov)
        metrics = train(c, overrides=ov, progress=False)
        out[name], _ = load_predictor(Path(metrics["checkpoint"]), spec_of(c, bank.read_meta(root)),
                                      c.predictor)
    return out


def adapt(cfg, run=None, overrides: list[str] | None = None, run_dir: Path | None = None) -> dict:
    """Run every variant of `adapt.variants` over the same seeded stream; returns the
    per-batch curves and a summary per variant (see the module docstring)."""
    overrides = list(overrides or [])
    tgt = target_config(cfg)
    t_ov = target_overrides(cfg, overrides)
    root = bank.require_bank(tgt, t_ov)
    meta = bank.read_meta(root)
    checkpoint = checkpoint_tokens(cfg.search.check_at, cfg.search.max_new_tokens)
    if checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens) != checkpoint:
        log.warning("train.checkpoint differs from search.check_at: the predictor scores prefixes "
                    "of another length than it learned on")
    predictors = load_predictors(cfg, tgt, overrides)
    from stopexp.store.features import require_features

    paths = replay_paths(root, require_features(tgt, t_ov), cfg.adapt.split, checkpoint,
                         vote_format(tgt.task))
    n_groups = int(paths.group.max()) + 1
    order, held = stream_order(n_groups, cfg.adapt.stream_prompts, cfg.adapt.heldout_prompts,
                               cfg.adapt.seed)
    heldout = take(paths, held) if len(held) else None
    sec_tok = meta.get("seconds_per_token", 0.0)
    if cfg.evaluate.mode == "online":  # the target LM in the loop, on the same prompts
        from stopexp.training.online import online_decider
        decide, continue_ = online_decider(tgt, paths, checkpoint)
    else:
        decide, continue_ = replay_decider(paths, cfg), replay_continuations(cfg)
    curves = {}
    for variant in cfg.adapt.variants:
        source = {"no_prune": None, "retrained": predictors.get("retrained")}.get(
            variant, predictors["frozen"])
        predictor = copy.deepcopy(source) if source is not None else None
        curves[variant] = run_stream(predictor, decide, order, heldout, cfg, variant=variant,
                                     checkpoint=checkpoint, seconds_per_token=sec_tok,
                                     continue_=continue_)
    summary = summarize(curves, cfg.adapt.batch_prompts)
    metrics = {"variants": summary, "curves": curves, "mode": cfg.evaluate.mode,
               "target": OmegaConf.to_container(cfg.adapt.target, resolve=True),
               "protocol": {"n": cfg.search.n_paths, "k": cfg.policy.keep, "check_tokens": checkpoint,
                            "policy": cfg.policy.name, "policy_params": policy_params(cfg.policy),
                            "stream_prompts": len(order), "heldout_prompts": len(held),
                            "batch_prompts": cfg.adapt.batch_prompts, "split": cfg.adapt.split},
               "bank": root.name}
    if run_dir is not None:
        metrics["plots"] = {"learning_curves": str(plots.learning_curves(
            curves, run_dir / "learning_curves.png"))}
    if run is not None:
        first = next(iter(curves.values()))
        for b, rec in enumerate(first):  # all variants at one step per batch: steps only rise
            run.log({f"{v}/{k}": x for v, recs in curves.items() for k, x in recs[b].items()
                     if k not in ("batch", "prompts_seen")}, step=rec["prompts_seen"])
        run.summary_update({f"{v}/{k}": x for v, s in summary.items() for k, x in s.items()
                            if isinstance(x, (int, float))})
        if run_dir is not None:
            run.log({"plots/learning_curves": run.image(metrics["plots"]["learning_curves"])})
    return metrics


def summarize(curves: dict, batch_prompts: int, last: int = 5) -> dict:
    """Per variant: accuracy and tokens over the stream, the tokens' share of no_prune's,
    the mean AUROC of the last `last` batches, the final held-out AUROC, and (for the
    online variants) the share of the frozen -> retrained held-out AUROC gap closed at the
    end and the prompts seen when half of it first was."""
    out = {}
    for v, recs in curves.items():
        w = np.asarray([r["prompts_seen"] - (recs[i - 1]["prompts_seen"] if i else 0)
                        for i, r in enumerate(recs)], float)
        out[v] = {"accuracy": float(np.average([r["accuracy"] for r in recs], weights=w)),
                  "tokens_total": float(sum(r["tokens"] for r in recs)),
                  "explore_tokens": float(sum(r["explore_tokens"] for r in recs)),
                  "mc_tokens": float(sum(r.get("mc_tokens", 0.0) for r in recs)),
                  "wall_s": float(sum(r["wall_s"] for r in recs)),
                  "update_s": float(sum(r["update_s"] for r in recs)),
                  "auroc_last": float(np.nanmean([r["auroc"] for r in recs[-last:]]))
                  if any(np.isfinite(r["auroc"]) for r in recs[-last:]) else math.nan,
                  "heldout_auroc": recs[-1].get("heldout_auroc", math.nan)}
    if "no_prune" in out:
        for s in out.values():
            s["tokens_ratio"] = s["tokens_total"] / out["no_prune"]["tokens_total"]
    if "frozen" in out and "retrained" in out:
        lo, hi = out["frozen"]["heldout_auroc"], out["retrained"]["heldout_auroc"]
        for v in ONLINE:
            if v in out and hi != lo:
                out[v]["gap_closed"] = (out[v]["heldout_auroc"] - lo) / (hi - lo)
                half = [r["prompts_seen"] for r in curves[v]
                        if (r["heldout_auroc"] - lo) / (hi - lo) >= 0.5]
                out[v]["prompts_to_half_gap"] = half[0] if half else None
    return out


def print_table(metrics: dict) -> str:
    p = metrics["protocol"]
    lines = [f"Online adaptation to {metrics['target']}: {p['stream_prompts']} prompts in batches of "
             f"{p['batch_prompts']}, {p['n']} -> "
             f"{kept_text(p.get('policy', 'topk'), p.get('policy_params', {}), p['k'])} at "
             f"{p['check_tokens']} tokens",
             f"{'variant':<12}{'accuracy':>9}{'tokens':>10}{'ratio':>7}{'explore':>9}{'MC tok':>8}"
             f"{'AUROC last':>11}{'held-out':>9}{'gap closed':>11}{'update s':>9}{'wall s':>8}"]
    for v, s in metrics["variants"].items():
        gap = f"{s['gap_closed']:.2f}" if "gap_closed" in s else "-"
        lines.append(f"{v:<12}{s['accuracy']:>9.3f}{s['tokens_total']:>10.0f}"
                     f"{s.get('tokens_ratio', math.nan):>7.2f}{s['explore_tokens']:>9.0f}"
                     f"{s.get('mc_tokens', 0.0):>8.0f}"
                     f"{s['auroc_last']:>11.3f}{s['heldout_auroc']:>9.3f}{gap:>11}{s['update_s']:>9.2f}"
                     f"{s['wall_s']:>8.1f}")
    return "\n".join(lines)


@stage_main("adapt")
def main(cfg: DictConfig) -> dict:
    validate(cfg)
    check_output_dirs(cfg)
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    with tracked_run(cfg, "adapt") as run:
        metrics = adapt(cfg, run, list(hc.overrides.task), run_dir)
    write_json(run_dir / "metrics.json", metrics)
    print(print_table(metrics))
    log.info("plots and metrics.json in %s", run_dir)
    return metrics


if __name__ == "__main__":
    main()
