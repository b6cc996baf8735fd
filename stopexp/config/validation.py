"""validate(): every check that needs no compute, in order: the whole config's (unknown
keys, allowed names, finite numbers, seeds), then each group's (stopexp.config.<group>)
with the rules spanning groups (stopexp.config.cross) where they bear, the keys read
unused (stopexp.config.reads), and the stage's own (evaluate, adapt)."""
from __future__ import annotations

import math
from dataclasses import is_dataclass
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from stopexp.config import (adapt, collect, cross, engine, evaluate, loss, model, policy,
                            predictor, reward, search, tap, task)
from stopexp.config.options import view_of
from stopexp.config.ranges import at_least, fail, get, n_layers_of
from stopexp.config.reads import (ALLOWED, check_beam_width_read, check_bertscore_model_read,
                                  check_sweeps_read, check_unread)
from stopexp.config.root import GROUPS
from stopexp.core.errors import ConfigError

SEED_KEYS = ("seed", "task.seed", "collect.seed", "train.seed", "evaluate.seed", "model.toy.seed",
             "adapt.seed", "engine.seed")


def unknown_keys(node: Any, prefix: str = "") -> list[str]:
    """Keys that no schema declares (`+key=value` can force them into a struct config)."""
    out = []
    if not isinstance(node, DictConfig):
        return out
    schema = view_of(OmegaConf.get_type(node), GROUPS)  # a section holds its group's view
    known = set(schema.__dataclass_fields__) if is_dataclass(schema) else None
    for key in node.keys():
        if key == "hydra":
            continue
        if known is not None and key not in known:
            out.append(f"{prefix}{key}")
        elif OmegaConf.is_dict(node._get_node(key)):
            out += unknown_keys(node[key], f"{prefix}{key}.")
    return out


def nonfinite(node: Any, key: str) -> Optional[tuple[str, float]]:
    """The first float in `node` (a plain container) that is NaN or infinite: (key, value)."""
    if isinstance(node, float) and not math.isfinite(node):
        return key, node
    if isinstance(node, dict):
        items = ((f"{key}.{k}", v) for k, v in node.items())
    elif isinstance(node, (list, tuple)):
        items = ((key, v) for v in node)  # a list entry is named by the list's key
    else:
        return None
    for sub_key, value in items:
        found = nonfinite(value, sub_key)
        if found:
            return found
    return None


def validate(cfg: DictConfig) -> DictConfig:
    """Every check that needs no compute, for the stages that `cfg.stage` will run: unknown
    keys, allowed names, finite floats (NaN and inf are refused everywhere), the range of
    every numeric key and the cross-field rules. Raises ConfigError naming the key; returns cfg."""
    unknown = unknown_keys(cfg)
    if unknown:
        fail(unknown[0], "no such key in the config schema (stopexp/config/); check the spelling")
    for key, allowed in ALLOWED.items():
        v = get(cfg, key)
        if v is not None and v not in allowed:
            fail(key, f"{v!r} is not allowed; allowed: {', '.join(allowed)}")
    for key in cfg:
        if key != "hydra":
            node = cfg[key]
            found = nonfinite(OmegaConf.to_container(node, resolve=True)
                              if OmegaConf.is_config(node) else node, str(key))
            if found:
                fail(found[0], f"{found[1]} is not a finite number")
    for key in SEED_KEYS:  # numpy's generators refuse negative seeds
        if get(cfg, key) is not None:
            at_least(key, get(cfg, key), 0)
    model.check_model(cfg)
    task.check_task(cfg.task)
    _check_search_and_taps(cfg)
    collect.check_collect(cfg)
    _check_predictor_loss_train(cfg)
    _check_reward(cfg)
    _check_engine(cfg)
    policy.check_thresholds(cfg.policy)
    check_unread(cfg)  # after the range checks: a bad value is named as such first
    check_beam_width_read(cfg)
    cross.bank_has_training_prompts(cfg)
    if cfg.stage in ("evaluate", "pipeline"):
        evaluate.check_evaluate(cfg)
        check_sweeps_read(cfg)
        check_bertscore_model_read(cfg)
    if cfg.stage == "adapt":
        adapt.check_adapt(cfg)
        # last, once the source config has passed: an error now comes from the target's values
        try:
            if cfg.adapt.target:  # the stream's config passes every check too (its target is empty)
                validate(adapt.shifted_config(cfg))
        except (ConfigError, ValueError) as e:
            raise ConfigError(f"adapt.target: {e}") from None
    return cfg


def _check_search_and_taps(cfg) -> None:
    m, s = cfg.model, cfg.search
    search.check_lengths(s)
    cross.fewshot_is_plain_text(cfg)
    tap.check_layers(cfg.tap, n_layers_of(m), m.toy.num_heads if m.toy is not None else None)
    search.check_sampling(s)
    tapped = tap.check_checkpoints(cfg.tap, s.max_new_tokens)
    if cfg.tap.positions.step_ends:
        cross.step_ends_need_a_separator(cfg)
    search.check_beam(s)
    cross.checks_are_tapped(cfg, tapped)
    cross.keep_per_check(cfg)


def _check_predictor_loss_train(cfg) -> None:
    predictor.check_predictor(cfg.predictor)
    cross.signals_are_tapped(cfg)
    cross.predictor_layer_is_tapped(cfg)
    loss.check_loss(cfg.loss)
    predictor.check_train(cfg.train)
    predictor.check_position_input(cfg.predictor)
    cross.positions_fit_the_predictor(cfg)


def _check_reward(cfg) -> None:
    """reward.*: an external reward names a registered or importable function; the
    regression losses need a reward in [0, 1]; nothing else is read unused."""
    reward.check_reward(cfg.reward)
    cross.regression_needs_bounded_reward(cfg)
    cross.online_reward_needs_no_logprobs(cfg)
    cross.min_gap_below_reward_range(cfg)


def _check_engine(cfg) -> None:
    """engine.*: nothing asked of engine=vllm that only the hf engine serves, then the vllm
    knobs' ranges and vllm importable, all before any model loads."""
    cross.vllm_serves_it(cfg)
    engine.check_engine(cfg)
