"""Every evaluated method as a scorer of the paths at the check: the baselines, the
external signals and the learned predictors (each loaded from its checkpoint; the
controls such as conf_features, and under train.positions=all the single-checkpoint
predictor, are trained here when missing, as they need no LM)."""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from omegaconf import OmegaConf

from stopexp.config import PredictorConfig
from stopexp.core.errors import ConfigError, NotFound, error_text
from stopexp.core.names import PREDICTOR_NAMES, REGISTRY, STOPPING_METHODS, lookup
from stopexp.core.protocol import checkpoint_tokens
from stopexp.models.super_token import load_super_token
from stopexp.signals import methods as M
from stopexp.signals.checkpoint import CheckpointDamaged, CheckpointMismatch, load_predictor
from stopexp.stages import build
from stopexp.stages.train import train
from stopexp.store import features as feature_bank
from stopexp.store.features import FeatureSet
from stopexp.training.data import trained_on


def build_scorers(cfg, names: list[str], spec, features: FeatureSet,
                  overrides: list[str] | None = None) -> dict:
    """name -> scorer for every method but no_prune; learned ones load their checkpoint
    (the conf_features control is trained here if missing: it needs no LM). `features`:
    the stage's (build.features(cfg)), which every predictor of cfg's bank and tap reads;
    `overrides`: the command line's, which the repair commands repeat."""
    scorers = {}
    for name in names:
        if name == "no_prune" or name in STOPPING_METHODS:  # no scorer: their own protocol
            continue
        if name == "random":  # a seeded draw per path
            scorers[name] = lookup("control", name)(cfg.evaluate.seed)
        elif name in REGISTRY["control"]:
            scorers[name] = lookup("control", name)
        elif name in REGISTRY["baseline"]:
            scorers[name] = lookup("baseline", name)
        elif name in PREDICTOR_NAMES:
            sub = cfg if name == cfg.predictor.name else _with_predictor(cfg, name)
            ckpt = build.predictor_dir(sub, features)
            command = f"python -m stopexp.train {' '.join(overrides or [])}".rstrip()
            if name != cfg.predictor.name:  # a control: made here, a damaged one remade
                train(sub, overrides=overrides, progress=False)
            elif not (ckpt / "predictor.json").exists():
                raise NotFound(
                    f"no trained {name} predictor for this config at {ckpt}; make it with: "
                    f"{command} (or run python -m stopexp.pipeline, which makes it for you)")
            try:
                if name == "super_token":  # on its own copy of the LM; online it reads the engine's cache
                    predictor, _ = load_super_token(ckpt, *build.lm(sub, progress=False), spec,
                                                    sub.predictor, cfg.search.max_batch_rows,
                                                    _trained_on(features, overrides))
                else:
                    predictor, _ = load_predictor(ckpt, spec, sub.predictor,
                                                  _trained_on(features, overrides))
            except (CheckpointDamaged, CheckpointMismatch) as e:
                raise type(e)(f"{e}; rebuild it with: {command}") from e
            scorers[name] = M.learned(predictor)
        else:
            scorers[name] = users_scorer(name, M.external(name))
    return scorers


def users_scorer(name: str, scorer):
    """A scorer registered with register_external, whose error is the user's: one line naming
    it in evaluate.methods (its traceback under STOPEXP_DEBUG=1), and its scores a tensor."""
    def score(batch):
        try:
            return torch.as_tensor(scorer(batch))
        except Exception as e:  # noqa: BLE001  (any error of the user's scorer)
            raise ConfigError(f"evaluate.methods: the scorer {name!r} (register_external) raised "
                              f"{error_text(e)}; fix it (STOPEXP_DEBUG=1 shows the traceback) or "
                              "leave it out of evaluate.methods") from e
    return score


def single_checkpoint_baseline(cfg, spec, features: FeatureSet,
                               overrides: list[str] | None = None) -> tuple[str, object] | None:
    """With train.positions=all: (label, predictor) of the same predictor trained the
    standard way, at train.checkpoint only and without the position input (trained here
    when missing, as the controls are), to be scored at every position. None otherwise."""
    if cfg.train.positions != "all":
        return None
    sub = copy.deepcopy(cfg)
    sub.train.positions, sub.predictor.position_input = "checkpoint", False
    train(sub, overrides=overrides, progress=False)
    predictor, _ = load_predictor(build.predictor_dir(sub, features), spec, sub.predictor,
                                  trained_on(features))
    tokens = checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)
    return f"{cfg.predictor.name}@{tokens}", predictor


def _trained_on(features: FeatureSet, overrides: list[str] | None) -> dict:
    """trained_on(features), complete features first checked against their record, so that
    features of another tap under the key are named as such, not as a stale predictor."""
    if feature_bank.is_complete(features.root):
        feature_bank.require_features(features, overrides, make=False)
    return trained_on(features)


def _with_predictor(cfg, name: str):
    """cfg with conf/predictor/<name>.yaml as its predictor (the controls' config)."""
    node = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "predictor" / f"{name}.yaml")
    node.pop("defaults", None)
    sub = cfg.copy()
    sub.predictor = OmegaConf.merge(OmegaConf.structured(PredictorConfig), node)
    return sub
