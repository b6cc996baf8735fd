"""validate(): every check that needs no compute, in order: the whole config's (unknown
keys, allowed names, finite numbers, seeds), each group's (stopexp.config.<group>), then
RULES: the rules spanning groups (stopexp.config.cross), the keys read unused
(stopexp.config.reads) and the stages' own checks (evaluate, adapt), each listed with the
stages that need it."""
from __future__ import annotations

import math
from dataclasses import is_dataclass
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from stopexp.config import (adapt, answers_replay, collect, cross, engine, evaluate, loss, model,
                            policy, predictor, reward, search, serve, tap, task)
from stopexp.config.limits import check_bounds, check_whole
from stopexp.config.machine import check_machine
from stopexp.config.option_files import check_bool_files, check_option_files
from stopexp.config.options import view_of
from stopexp.config.ranges import at_least, fail, get, n_layers_of
from stopexp.config.reads import (ALLOWED, check_beam_width_read, check_bertscore_model_read,
                                  check_block_size_read, check_score_rule_read, check_sweeps_read,
                                  check_unread)
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


def group_checks(cfg) -> None:
    """Each group's checks of its own keys (bounds from other groups where they bear)."""
    model.check_model(cfg)
    task.check_task(cfg.task)
    search.check_lengths(cfg.search)
    m = cfg.model
    tap.check_layers(cfg.tap, n_layers_of(m), m.toy.num_heads if m.toy is not None else None)
    search.check_sampling(cfg.search)
    tap.check_checkpoints(cfg.tap, cfg.search.max_new_tokens)
    search.check_beam(cfg.search)
    collect.check_collect(cfg)
    predictor.check_predictor(cfg.predictor)
    loss.check_loss(cfg.loss)
    predictor.check_train(cfg.train)
    predictor.check_position_input(cfg.predictor)
    predictor.check_centre_prompts(cfg.predictor)
    predictor.check_pca_components(cfg.predictor)
    reward.check_reward(cfg.reward)
    engine.check_engine(cfg)
    policy.check_thresholds(cfg.policy)


def adapt_target_validates(cfg) -> None:
    """The adapt stream's config (the source shifted by adapt.target) passes every check
    too; an error then names the target's values."""
    try:
        if cfg.adapt.target:  # the stream's config has an empty target
            validate(adapt.shifted_config(cfg))
    except (ConfigError, ValueError) as e:
        raise ConfigError(f"adapt.target: {e}") from None


STAGES = ("collect", "featurize", "train", "evaluate", "pipeline", "adapt", "toy_lm", "serve")
EVALUATING = ("evaluate", "pipeline")
TRAINING = ("train", "pipeline", "adapt")
# The rules spanning groups (stopexp.config.cross), the keys read unused
# (stopexp.config.reads) and the stages' own checks, each with the stages that need it, in
# the order validate applies them (after the group checks: a bad value is named as such first)
RULES = (
    (cross.fewshot_is_plain_text, STAGES),
    (cross.step_ends_need_a_separator, STAGES),
    (cross.checks_are_tapped, STAGES),
    (cross.keep_per_check, STAGES),
    (cross.adapt_takes_one_check, ("adapt",)),
    (cross.signals_are_tapped, STAGES),
    (cross.predictor_layer_is_tapped, ("train", "evaluate", "pipeline", "adapt", "serve")),
    (cross.positions_fit_the_predictor, STAGES),
    (cross.regression_needs_bounded_reward, STAGES),
    (cross.monte_carlo_labels_are_tapped, TRAINING),
    (cross.accumulation_is_one_batch, TRAINING),
    (cross.online_reward_needs_no_logprobs, EVALUATING),
    (cross.min_gap_below_reward_range, STAGES),
    (cross.vllm_serves_it, STAGES),
    (check_unread, STAGES),
    (check_bounds, STAGES),  # after check_unread: a key nothing reads is named as such first
    (check_beam_width_read, STAGES),
    (check_block_size_read, STAGES),
    (check_score_rule_read, STAGES),
    (task.task_draws_the_prompts, STAGES),  # after the rules on values: it draws the problems
    (cross.bank_has_training_prompts, TRAINING),
    (evaluate.check_evaluate, EVALUATING),
    (cross.attn_entropy_method_is_tapped, EVALUATING),
    (cross.error_oracle_reads_values, EVALUATING),
    (cross.beam_has_nothing_to_select, EVALUATING),
    (policy.check_risk_calibration, EVALUATING),
    (cross.beam_has_no_vote, EVALUATING),
    (cross.beam_scores_each_step, EVALUATING),
    (cross.beam_keep_below_width, EVALUATING),
    (check_sweeps_read, EVALUATING),
    (check_bertscore_model_read, EVALUATING),
    (adapt.check_adapt, ("adapt",)),
    (serve.check_serve, ("serve",)),
    (adapt_target_validates, ("adapt",)),  # last: by then an error comes from the target's values
)


def validate(cfg: DictConfig, runtime=None, machine: bool = True) -> DictConfig:
    """Every check that needs no compute, for the stages that `cfg.stage` will run: unknown
    keys, the option files' keys (with `runtime`, Hydra's runtime of the composition, or
    cfg.hydra.runtime where cfg carries it: stopexp.config.option_files), allowed names,
    finite floats (NaN and inf are refused everywhere), whole counts and counts within their
    bounds (stopexp.config.limits), the range of every numeric key (the
    group checks), the rules of RULES whose stages include cfg.stage and, with `machine`, what
    this machine cannot run (stopexp.config.machine: False where the jobs run on other
    machines, as a SLURM sweep's, or to check a config written for another machine). Raises
    ConfigError naming the key; returns cfg."""
    if cfg.stage == "answers_replay":  # a stage of its own schema, without the study's groups
        check_whole(cfg, answers_replay.AnswersReplayConfig)
        answers_replay.check_answers_replay(cfg)
        return cfg
    unknown = unknown_keys(cfg)
    if unknown:
        fail(unknown[0], "no such key in the config schema (stopexp/config/); check the spelling")
    if runtime is None and "hydra" in cfg:
        runtime = cfg.hydra.runtime
    if runtime is not None:
        check_option_files(cfg, runtime)
        check_bool_files(runtime)
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
    check_whole(cfg)
    for key in SEED_KEYS:  # numpy's generators refuse negative seeds
        if get(cfg, key) is not None:
            at_least(key, get(cfg, key), 0)
    group_checks(cfg)
    for rule, stages in RULES:
        if cfg.stage in stages:
            rule(cfg)
    if machine:
        check_machine(cfg)
    return cfg
