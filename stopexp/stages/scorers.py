"""Every evaluated method as a scorer of the paths at the check: the baselines, the
external signals and the learned predictors, each loaded from the checkpoint that train
made (the configured predictor and its controls: stopexp.stages.build.controls)."""
from __future__ import annotations

import torch

from stopexp.core.commands import make_with, stage_command
from stopexp.core.errors import ConfigError, NotFound, error_text
from stopexp.core.names import REGISTRY, lookup, names as registered, predictor_names, runs_the_lm
from stopexp.core.protocol import checkpoint_tokens
from stopexp.signals import methods as M
from stopexp.signals.saved_predictor import CheckpointDamaged, CheckpointMismatch, load_predictor
from stopexp.stages import build
from stopexp.stages.trained_with import Trained
from stopexp.store import feature_sets
from stopexp.store.feature_sets import FeatureSet
from stopexp.training.data import trained_on


def build_scorers(cfg, names: list[str], spec, features: FeatureSet,
                  overrides: list[str] | None = None, home: Trained | None = None) -> dict:
    """name -> scorer for every method but no_prune; learned ones load the checkpoint train
    made (`load_trained`). `features`: the stage's (build.feature_set(cfg)), which every
    predictor of cfg's bank and tap reads; `overrides`: the command line's, which the
    repair commands repeat; `home`: where the predictors were trained, when not on cfg's
    own bank (stopexp.stages.trained_with)."""
    home = home or Trained(cfg, features, list(overrides or []))
    scorers = {}
    for name in names:
        if name == "no_prune" or name in registered("stopping"):  # no scorer: their own protocol
            continue
        if name == "random":  # a seeded draw per path
            scorers[name] = lookup("control", name)(cfg.evaluate.seed)
        elif name in REGISTRY["control"]:
            scorers[name] = lookup("control", name)
        elif name in REGISTRY["baseline"]:
            scorers[name] = lookup("baseline", name)
        elif name in predictor_names():
            sub = home.cfg if name == home.cfg.predictor.name else build.with_predictor(home.cfg, name)
            scorers[name] = M.learned(load_trained(sub, spec, home.features, made_by(home, name)))
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


def load_trained(sub, spec, features: FeatureSet, overrides: list[str] | None = None):
    """The predictor of `sub` (cfg or one of its controls) as train saved it; NotFound, or
    the damage, with the train command that makes it."""
    ckpt = build.predictor_dir(sub, features)
    if not (ckpt / "predictor.json").exists():
        # train reads the features: without them its command would only name the next gap
        how = make_with("train", overrides) if feature_sets.is_complete(features.root) else \
            f"nor its features; make them all with: {stage_command('pipeline', overrides)}"
        raise NotFound(f"no trained {sub.predictor.name} predictor for this config at {ckpt}; {how}")
    try:
        if runs_the_lm(sub.predictor.name):  # on its own copy of the LM; online it reads the engine's cache
            predictor, _ = lookup("lm_predictor", sub.predictor.name).from_checkpoint(
                ckpt, *build.lm(sub, progress=False), spec, sub.predictor, sub.search.max_batch_rows,
                _trained_on(features, overrides))
        else:
            predictor, _ = load_predictor(ckpt, spec, sub.predictor, _trained_on(features, overrides))
    except (CheckpointDamaged, CheckpointMismatch) as e:
        raise type(e)(f"{e}; rebuild it with: {stage_command('train', overrides)}") from e
    return predictor


def made_by(home: Trained, name: str) -> list[str]:
    """The overrides of the train command that makes predictor `name` under `home`: its own,
    which train the configured predictor and the controls of its evaluate.methods, and
    otherwise those with `name` among evaluate.methods."""
    if name == home.cfg.predictor.name or name in build.controls(home.cfg):
        return home.overrides
    return [*home.overrides, f"evaluate.methods=[learned,{name}]"]


def single_checkpoint_baseline(home: Trained, spec) -> tuple[str, object] | None:
    """With train.positions=all: (label, predictor) of the same predictor trained the
    standard way (a control of build.controls) where `home` trained its predictors, to be
    scored at every position. None otherwise."""
    cfg = home.cfg
    if cfg.train.positions != "all":
        return None
    label = f"{cfg.predictor.name}@{checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)}"
    return label, load_trained(build.controls(cfg)[label], spec, home.features, home.overrides)


def _trained_on(features: FeatureSet, overrides: list[str] | None) -> dict:
    """trained_on(features), complete features first checked against their record, so that
    features of another tap under the key are named as such, not as a stale predictor."""
    if feature_sets.is_complete(features.root):
        feature_sets.require_features(features, overrides)
    return trained_on(features)
