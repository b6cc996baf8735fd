"""Predictors trained on another bank, scored on this one (evaluate.trained_with).

    python -m stopexp.evaluate +exp=toy_contrastive seed=1 \\
        'evaluate.trained_with="+exp=toy_contrastive"'

`evaluate.trained_with` holds the overrides of a train command line. Its config is composed
as that command composes it, its predictors (the configured one and the controls
evaluate.methods names) are looked up under its features by the key train saved them
under, and they score this config's bank (`evaluate.split`) as its own predictors would:
the predictor, loss and train sections of the training config replace this config's, so
that evaluate's labels, checks and controls are those of what was trained. A predictor
reads hidden states and confidence columns, so the two configs' features must be of one
kind: the same LM (its weights and dtype), tap layers, width, pooling, attention heads and
confidence columns (search.conf_topk, search.group_window); anything else (the task, its
prompts, the sampling, the positions stored) may differ. A difference is refused in one line
before anything is loaded."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf, open_dict

from stopexp.config.evaluate import trained_with_overrides
from stopexp.core.errors import ConfigError
from stopexp.runtime.artifacts import plain
from stopexp.runtime.overrides import stage_config
from stopexp.stages import build
from stopexp.store import bank, feature_sets
from stopexp.store.feature_sets import FeatureSet
from stopexp.store.keys import content_store, model_content

KEY = "evaluate.trained_with"
# what the LM's hidden states depend on: the model section's keys that choose its weights
# and their precision (device, batch sizes, prompt limits and the chat template do not)
LM_KEYS = ("name", "path", "gguf_file", "revision", "dtype", "toy")
# the keys of the tap and the confidence columns that a predictor's input depends on
CONFIG_KEYS = ("tap.pooling", "tap.attention_heads", "search.conf_topk", "search.group_window")
# the same as the features record them, the LM's layers and width resolved
# (stopexp.store.feature_sets.expected_meta)
FEATURE_KEYS = {"model_name": "model.name", "hidden_size": "the LM's width, hidden_size",
                "tap_layers": "tap.layers (resolved)", "attention_heads": "tap.attention_heads (resolved)",
                "signal_names": "the signal columns"}


@dataclass(frozen=True)
class Trained:
    """Where a stage finds its predictors: the config train ran with, the features they
    learned from and that train command's overrides (the command printed for one missing)."""
    cfg: Any
    features: FeatureSet
    overrides: list[str]


def predictors_for(cfg, features: FeatureSet, overrides: list[str] | None = None):
    """(the config evaluate runs, where its predictors are). Without evaluate.trained_with:
    `cfg` and its own; with it, `cfg` with the training config's predictor, loss and train
    sections, and that config's predictors, after `check_same_input`."""
    text = cfg.evaluate.trained_with
    if text is None:
        return cfg, Trained(cfg, features, list(overrides or []))
    lines = trained_with_overrides(text)
    try:
        trainer = stage_config("train", lines)
    except ConfigError as e:
        raise ConfigError(f"{KEY}: {e}") from None
    theirs = build.feature_set(trainer)
    check_same_input(trainer, theirs, lines, cfg, features, overrides)
    evaluating = copy.deepcopy(cfg)
    with open_dict(evaluating):
        for section in ("predictor", "loss", "train"):
            evaluating[section] = copy.deepcopy(trainer[section])
    return evaluating, Trained(trainer, theirs, lines)


def lm_identity(model, cache_dir) -> dict:
    """The model section's keys that make its hidden states (`LM_KEYS`), and the content of
    a local weights file or directory."""
    section = plain(model)
    out = {k: section.get(k) for k in LM_KEYS}
    out["content"] = model_content(section, content_store(cache_dir))
    return out


def check_same_input(trainer, theirs: FeatureSet, lines: list[str], cfg, ours: FeatureSet,
                     overrides: list[str] | None = None) -> None:
    """ConfigError (one line, naming the key) where the training config's features are of
    another kind than this config's: another LM, tap or confidence columns. The config's
    keys first; then the two banks' records of the LM (its name, width and depth, which
    resolve the tap layers): a missing bank is named with the command that makes it."""
    pairs = [(f"model.{k}", a, b) for k, a, b in zip(
        [*LM_KEYS, "content"], *(lm_identity(c.model, c.paths.cache_dir).values() for c in (trainer, cfg)))]
    pairs += [(k, OmegaConf.select(trainer, k), OmegaConf.select(cfg, k)) for k in CONFIG_KEYS]
    for key, a, b in pairs:
        if plain(a) != plain(b):
            refuse(*first_difference(key, plain(a), plain(b)))
    want = feature_sets.expected_meta(theirs, bank.read_meta(bank.require_bank(theirs.bank, lines)))
    have = feature_sets.expected_meta(ours, bank.read_meta(bank.require_bank(ours.bank, overrides)))
    for field, name in FEATURE_KEYS.items():
        if want.get(field) != have.get(field):
            refuse(name, want.get(field), have.get(field))


def first_difference(key: str, a, b) -> tuple[str, object, object]:
    """(the innermost key where `a` and `b` differ, its two values)."""
    while isinstance(a, dict) and isinstance(b, dict):
        inner = next((k for k in sorted({*a, *b}) if a.get(k) != b.get(k)), None)
        if inner is None:
            break
        key, a, b = f"{key}.{inner}", a.get(inner), b.get(inner)
    return key, a, b


def refuse(what: str, theirs, ours) -> None:
    raise ConfigError(f"{KEY}: its predictors read features with {what}={theirs}, this "
                      f"config's are {what}={ours}; a predictor scores features of the "
                      "same LM (weights and dtype), tap layers, width, pooling, attention heads "
                      "and confidence columns: set the same here, or train on this kind of features")


def trained_record(home: Trained) -> dict:
    """What metrics.json says of predictors trained on another bank: the train command's
    overrides, the bank and the features they learned from."""
    return {"overrides": home.overrides, "bank": home.features.bank.key, "features": home.features.key}
