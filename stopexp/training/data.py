"""The predictor's data: what it learns from (`trained_on`), the feature spec, the
splits' rows at the training checkpoint, and the checks that the data can teach anything
(`NothingToLearn`) and that rewards lie in the loss's range."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from stopexp.core.errors import ConfigError, UserError
from stopexp.metrics import is_binary
from stopexp.metrics.bounds import BOUND_SLACK, digits
from stopexp.runtime.artifacts import config_hash
from stopexp.signals import FeatureSpec
from stopexp.store import bank, feature_rows
from stopexp.store import feature_sets

log = logging.getLogger(__name__)


def trained_on(features: feature_sets.FeatureSet) -> dict:
    """What a predictor learns from, by content: {"bank", "features"} (the trace bank of
    `features` and the features themselves), each a SHA-256 of the SHA-256s of the
    artifact's shard files as its meta.json records them (stopexp.runtime.integrity), None
    where the artifact is not there or not complete. predictor.json records it; a bank
    re-collected or features re-made under the key change it."""
    out = {}
    for name, root, kind in (("bank", features.bank.root, "trace bank"),
                             ("features", features.root, feature_sets.KIND)):
        meta = bank.read_meta(root, kind=kind) if (root / "meta.json").exists() else {}
        files = {n: {f: r["sha256"] for f, r in rec["files"].items()}
                 for n, rec in meta["shards"].items()} if meta.get("complete") else None
        out[name] = None if files is None else config_hash(files, length=64)
    return out


def feature_spec(meta: dict) -> FeatureSpec:
    """The spec recorded in a features meta.json (`stopexp.store.feature_sets.feature_spec`)."""
    return feature_sets.feature_spec(meta)


def mixed_only(rows: dict) -> dict:
    """The rows (a split's training data) of the prompts whose rows hold both outcomes (some
    paths end correct, some not): train.mixed_only. The prompt is "prompt_group" where rows
    are grouped by (prompt, position) (train.positions=all), else "group"."""
    prompt = np.asarray(rows.get("prompt_group", rows["group"]))
    correct = np.asarray(rows["correct"]) > 0.5
    held = np.unique(prompt)
    some_right = np.isin(held, prompt[correct])
    some_wrong = np.isin(held, prompt[~correct])
    keep = np.isin(prompt, held[some_right & some_wrong])
    if not keep.any():
        raise ConfigError(f"train.mixed_only: none of the {len(held)} training prompts has paths "
                          "with both outcomes here, so nothing is left to train on; set "
                          "train.mixed_only=false, or train on more prompts")
    return bank.select_rows(rows, torch.from_numpy(keep))


def first_prompts(prompt_ids: np.ndarray, max_prompts: int | None) -> np.ndarray:
    """(R,) bool: the rows (`prompt_ids`: the prompt id of each row of the bank's train
    split) whose prompt is among the split's first `max_prompts` (train.max_prompts), those
    of the smallest ids: the bank's order, so that a smaller limit's prompts are among a
    larger one's and one bank serves every size. Every row for None; ConfigError naming the
    key when the split holds fewer prompts."""
    held = np.unique(prompt_ids)
    if max_prompts is None:
        return np.ones(len(prompt_ids), bool)
    if max_prompts > len(held):
        raise ConfigError(f"train.max_prompts: {max_prompts} exceeds the {len(held)} train prompts "
                          f"the trace bank holds; lower it to at most {len(held)} or collect more "
                          "(collect.prompts.train)")
    return np.isin(prompt_ids, held[:max_prompts])


def train_prompts(ds, max_prompts: int | None) -> int:
    """How many prompts of the bank's train split `ds` the predictor trains on."""
    ids = np.asarray(ds["prompt_id"][:])
    return len(np.unique(ids[first_prompts(ids, max_prompts)]))


def split_data(root: Path, meta: dict, features: Path, ckpt: int, n_paths: int,
               min_gap: float, prefixes: bool = False,
               max_prompts: int | None = None) -> dict[str, dict]:
    """Per split, the tensors of the paths still alive at the training checkpoint `ckpt`
    (tokens; with `prefixes`, also their prompts and tokens), from the bank at `root`
    (`meta` its meta.json) and its features at `features`; of the train split, only the
    paths of its first `max_prompts` prompts (`first_prompts`; None: all). The splits are
    the task's, which are disjoint by prompt, so no prompt is in two parts. `n_paths`
    (search.n_paths) and `min_gap` (`pair_min_gap`) word the error when a split cannot
    teach anything (NothingToLearn; an empty split's error says why its prompts were left
    out)."""
    out = {}
    for split in ("train", "val", "test"):
        if not bank.split_rows(meta, split):
            continue
        ds = bank.load_bank(root, split)
        t = feature_rows.tensors_at(ds, feature_rows.load_features(features, split), ckpt)
        if prefixes:
            t.update(bank.prefix_columns(ds))
        keep = t["alive"]
        if split == "train":
            keep = keep & torch.from_numpy(first_prompts(np.asarray(ds["prompt_id"][:]), max_prompts))
        out[split] = bank.select_rows(t, keep)
    for needed in ("train", "val"):
        if needed not in out or not len(out[needed]["correct"]):
            raise NothingToLearn(_empty_split(meta, needed, ckpt))
        check_usable(needed, out.get(needed), ckpt, n_paths, min_gap)
    return out


REGRESSION_LOSSES = ("reward_regression", "mse")


def pair_min_gap(loss) -> float:
    """loss.min_gap where the loss mines pairs by it (contrastive, pairwise), else 0."""
    return float(loss.min_gap) if loss.name in ("contrastive", "pairwise") else 0.0


def check_reward_range(loss, reward: str, data: dict) -> int:
    """The regression losses (`loss`: the loss section; `reward`: reward.name) aim sigmoid(score) at the reward, so it must lie in [0, 1];
    validate refuses the unbounded built-in rewards, an external one is checked here, on
    the loaded splits (`data`: split -> tensors with "reward" and "mc", the Monte Carlo
    labels: mean rewards, NaN where none). Values within rounding of [0, 1]
    (stopexp.metrics.bounds.BOUND_SLACK, as BERTScore's 1.0000001) are clipped into it, in place;
    returns how many. ValueError naming loss.name and the range found, in full digits."""
    if loss.name not in REGRESSION_LOSSES:
        return 0
    clipped = 0
    for split, d in data.items():
        for key in ("reward", "mc"):
            r = d.get(key)
            v = r.numpy() if r is not None else np.zeros(0)
            v = v[~np.isnan(v)]
            if not len(v):
                continue
            lo, hi = v.min(), v.max()
            if not (lo >= -BOUND_SLACK and hi <= 1 + BOUND_SLACK):
                what = "rewards" if key == "reward" else "Monte Carlo labels (mean rewards)"
                raise ConfigError(f"loss.name: {loss.name} regresses a probability on the reward, "
                                  f"but the {split} paths' {what} (reward={reward}) span "
                                  f"[{digits(lo)}, {digits(hi)}], outside [0, 1] by more than rounding "
                                  f"({BOUND_SLACK:g}); use loss=contrastive or pairwise, or a reward "
                                  "in [0, 1]")
            clipped += int(((v < 0) | (v > 1)).sum())
            d[key] = r.clamp(0, 1)  # NaN (no label) stays NaN
    if clipped:
        log.info("clipped %d rewards / Monte Carlo labels within %g of [0, 1] into it (rounding)",
                 clipped, BOUND_SLACK)
    return clipped


class NothingToLearn(UserError, ValueError):
    """A split that cannot train or select a predictor: no prompt has both a correct and a
    wrong path alive at the training checkpoint."""


def check_usable(split: str, data: dict | None, ckpt: int, n_paths: int,
                 min_gap: float = 0.0) -> int:
    """The number of prompts of `split` with both a correct and a wrong path alive at the
    checkpoint (the pairs the losses and the within-prompt AUROC are made of; with a
    continuous reward, paths whose rewards differ by more than `min_gap`, the pair losses'
    loss.min_gap); raises NothingToLearn naming the split, its counts and the fixes when
    there is none."""
    n = len(data["correct"]) if data is not None else 0
    groups = data["group"].numpy() if n else np.zeros(0, int)
    correct = data["correct"].numpy() > 0.5 if n else np.zeros(0, bool)
    prompts = np.unique(groups)
    mixed = sum(bool(correct[groups == g].any() and (~correct[groups == g]).any()) for g in prompts)
    reward = data["reward"].numpy() if n and "reward" in data else None
    if reward is not None and not is_binary(reward):  # a continuous reward orders the pairs
        mixed = sum(bool(np.ptp(reward[groups == g]) > min_gap) for g in prompts)
        if not mixed and min_gap > 0:
            raise NothingToLearn(
                f"train: the {split} split has no pair at checkpoint {ckpt} tokens whose rewards "
                f"differ by more than loss.min_gap={min_gap} (the widest spread within a prompt "
                f"is {max((float(np.ptp(reward[groups == g])) for g in prompts), default=0.0):.4g}), "
                "so the pair losses skip every pair; lower loss.min_gap")
    if mixed:
        return mixed
    raise NothingToLearn(
        f"train: the {split} split has no usable pair at checkpoint {ckpt} tokens "
        f"(train.checkpoint): {len(prompts)} prompts with {n} paths alive there, {int(correct.sum())} "
        f"of them correct, and no prompt has both a correct and a wrong path. Training and its "
        f"epoch selection compare paths of one prompt, so nothing can be learned. Collect more "
        f"prompts (collect.prompts.{split}), give the split a larger share "
        f"(task.split_fractions), keep prompts with mixed outcomes (collect.keep_correct=[1, "
        f"{max(n_paths - 1, 1)}]), or try another task.seed or seed.")


def _empty_split(meta: dict, split: str, ckpt: int) -> str:
    """Why a split the predictor needs has no path alive at the checkpoint, and the fix."""
    planned, rows = bank.planned_prompts(meta, split), bank.split_rows(meta, split)
    if not planned:
        return (f"collect.prompts.{split}: the trace bank holds no {split} prompts (0 were "
                f"collected); collect some, e.g. collect.prompts.{split}=100")
    if not rows:
        return f"train: the trace bank holds no {split} path: {bank.left_out(meta, split)}"
    return (f"train.checkpoint: none of the {rows} {split} paths of the trace bank is still "
            f"generating at checkpoint {ckpt} tokens (all ended earlier); choose an earlier "
            f"train.checkpoint (a position the features hold)")
