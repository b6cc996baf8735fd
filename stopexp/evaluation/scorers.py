"""Every evaluated method as a scorer of the paths at the check: the baselines, the
external signals and the learned predictors (each loaded from its checkpoint; the
controls such as conf_features are trained here when missing, as they need no LM)."""
from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from stopexp.config import ALLOWED, PredictorConfig, check_method_names, checkpoint_tokens
from stopexp.config import ALWAYS_METHODS as ALWAYS
from stopexp.core.errors import NotFound
from stopexp.core.names import PREDICTOR_NAMES, method_name
from stopexp.models import load_lm
from stopexp.models.super_token import load_super_token
from stopexp.signals import methods as M
from stopexp.signals.checkpoint import CheckpointDamaged, CheckpointMismatch, load_predictor
from stopexp.stopping.replay import STOPPING_METHODS
from stopexp.store import features as feature_bank
from stopexp.training.data import features_of, predictor_dir, trained_on
from stopexp.training.predictor import train

log = logging.getLogger(__name__)


def method_names(cfg) -> list[str]:
    """The methods to evaluate, in order: the always-run ones (ALWAYS_METHODS: no_prune,
    random, confidence, oracle) missing from evaluate.methods first, then evaluate.methods
    with `learned` as the configured predictor's name, no duplicates. So
    evaluate.methods=[] runs exactly the four always-run methods."""
    names = [method_name(m, cfg.predictor.name) for m in cfg.evaluate.methods]
    added = [m for m in ALWAYS if m not in names]
    if added:  # the contract of metrics.json: these four are always among the methods
        log.info("evaluate.methods: %s run too (%s always run)", ", ".join(added), ", ".join(ALWAYS))
    return list(dict.fromkeys([*added, *names]))


def warn_off_checkpoint(cfg, names: list[str], plan: list[tuple[int, int]]) -> str | None:
    """One log line (returned) when a learned method trained at train.checkpoint alone
    scores paths at a check of another prefix (a later progressive check, say): there it
    reads features from outside its training distribution."""
    learned = [m for m in names if m in ALLOWED["predictor.name"]]
    trained = checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)
    other = [t for t, _ in plan if t != trained]
    if not learned or not other or cfg.train.positions == "all":
        return None
    message = (f"{', '.join(learned)} trained at {trained} tokens (train.checkpoint) score the "
               f"check(s) at {other} tokens too, outside their training distribution; "
               "train.positions=all trains them at every stored position")
    log.warning(message)
    return message


def check_methods(cfg) -> None:
    """Unknown method names fail before any compute (also checked by config.validate)."""
    check_method_names(cfg.evaluate.methods)


def build_scorers(cfg, names: list[str], spec) -> dict:
    """name -> scorer for every method but no_prune; learned ones load their checkpoint
    (the conf_features control is trained here if missing: it needs no LM)."""
    scorers = {}
    for name in names:
        if name == "no_prune" or name in STOPPING_METHODS:  # no scorer: their own protocol
            continue
        if name == "random":
            scorers[name] = M.random_scorer(cfg.evaluate.seed)
        elif name == "oracle":
            scorers[name] = M.oracle
        elif name == "error_oracle":
            scorers[name] = M.error_oracle
        elif name in M.BASELINES:
            scorers[name] = M.BASELINES[name]
        elif name in PREDICTOR_NAMES:
            sub = cfg if name == cfg.predictor.name else _with_predictor(cfg, name)
            ckpt = predictor_dir(sub)
            command = f"python -m stopexp.train {' '.join(cli_overrides())}".rstrip()
            if name != cfg.predictor.name:  # a control: made here, a damaged one remade
                train(sub, progress=False)
            elif not (ckpt / "predictor.json").exists():
                raise NotFound(
                    f"no trained {name} predictor for this config at {ckpt}; make it with: "
                    f"{command} (or run python -m stopexp.pipeline, which makes it for you)")
            try:
                if name == "super_token":  # on its own copy of the LM; online it reads the engine's cache
                    lm = load_lm(sub.model, sub.paths.cache_dir, sub.task, sub.tap, progress=False)
                    predictor, _ = load_super_token(ckpt, *lm, spec,
                                                    sub.predictor, cfg.search.max_batch_rows,
                                                    _trained_on(sub))
                else:
                    predictor, _ = load_predictor(ckpt, spec, sub.predictor, _trained_on(sub))
            except (CheckpointDamaged, CheckpointMismatch) as e:
                raise type(e)(f"{e}; rebuild it with: {command}") from e
            scorers[name] = M.learned(predictor)
        else:
            scorers[name] = M.external(name)
    return scorers


def _trained_on(cfg) -> dict:
    """trained_on(cfg), complete features first checked against their record, so that
    features of another tap under the key are named as such, not as a stale predictor."""
    features = features_of(cfg)
    if feature_bank.is_complete(features.root):
        feature_bank.require_features(features, cli_overrides(), make=False)
    return trained_on(cfg)


def _with_predictor(cfg, name: str):
    """cfg with conf/predictor/<name>.yaml as its predictor (the controls' config)."""
    node = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "predictor" / f"{name}.yaml")
    node.pop("defaults", None)
    sub = cfg.copy()
    sub.predictor = OmegaConf.merge(OmegaConf.structured(PredictorConfig), node)
    return sub


def cli_overrides() -> list[str]:
    """The command line's Hydra overrides ([] outside a Hydra run), to print the command
    that rebuilds a missing or damaged artifact."""
    try:
        from hydra.core.hydra_config import HydraConfig
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []
