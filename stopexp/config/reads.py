"""Which values are allowed, and which keys only some options read (a group's own options:
their schemas, stopexp.config.options; another group's: `READ_ONLY_BY`): such a key is
refused off its default where the chosen option ignores it (`check_unread`), and an exp
sets it as ${stopexp_where_read:KEY,VALUE} (`where_read`). A default derived from
other keys (evaluate.retention from search.n_paths) is the one this config derives
(`default_in`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from stopexp.config import answers_replay
from stopexp.config.options import by_name
from stopexp.config.predictor import UNTRAINED_PREDICTORS
from stopexp.config.ranges import fail, is_list
from stopexp.config.root import GROUPS, schema, schema_default
from stopexp.config.stopping import TracesStopping, setting_keys
from stopexp.core.protocol import check_values
from stopexp.core.config_text import TEXT_TOKENIZERS

ALLOWED = {
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "model.long_prompts": ("error", "skip"),
    # a group's options: those with a schema (stopexp.config.options); a group with a base
    # schema checks its names against the registry (stopexp.config.task.check_task)
    **{f"{g.name}.name": tuple(g.options) for g in GROUPS if g.chosen is by_name and g.base is None},
    "task.format": ("fewshot", "chat"),
    "task.answer_format": ("numeric", "boxed"),
    "task.extraction": ("strict", "flexible"),
    "task.solution_style": ("inline", "lines"),  # stopexp.tasks.wordprob.SOLUTION_STYLES
    "task.shot_match": ("first_operation", "structure", "operations"),  # wordprob.SHOT_MATCHES
    "task.tokenize": TEXT_TOKENIZERS,
    "tap.pooling": ("last", "mean"),
    "tap.positions.dtype": ("float32", "float16"),
    "predictor.statistic": ("l2", "mean", "var"),
    "train.positions": ("checkpoint", "all"),
    "loss.labels": ("mc", "reward"),
    "policy.risk": ("voter", "answer"),
    "logger.name": ("wandb", "none"),
    "logger.mode": ("offline", "online", "disabled"),
    "evaluate.mode": ("replay", "online"),
    "evaluate.vote": ("majority", "weighted", "filtered"),
    "search.score_rule": ("last", "running_mean"),
    "evaluate.select": ("vote", "signal", "lm_score", "oracle"),
    "engine.dtype": ("auto", "float32", "bfloat16", "float16"),
}
# Keys that only some options of another group read (a group's own options' keys are their
# schemas': `unread_by_option`): key -> (the key naming the option, the options that read
# it; for evaluate.methods, the methods; for a bool key, the values), or a tuple of such
# conditions, all of which must hold. Under another option the run would ignore the
# key, so validate refuses any value but the schema default (`check_unread`). An exp sets
# such a key as ${stopexp_where_read:KEY,VALUE}: VALUE where it is read, else the default,
# so that replacing the exp's option (+exp=toy_datatotext loss=mse) just works.
# Not here: search.beam_width (evaluate.compare_beam reads it under search=parallel:
# check_beam_width_read). A sweep over policies sets each policy's budget with
# ${stopexp_where_read:...} (conf/hparams_search/optuna_toy.yaml, scripts/sweep_policies.sh).


@dataclass(frozen=True)
class AllBut:
    """The readers of a key: every option but `options`, those registered from outside the
    package included."""
    options: tuple[str, ...]

    def __contains__(self, option) -> bool:
        return option not in self.options

    def text(self, group: str) -> str:
        return f"a {group} other than {'|'.join(self.options)}"


@dataclass(frozen=True)
class Given:
    """The readers of a key: any value of the option key but null."""
    what: str  # what the value is, as a message names it

    def __contains__(self, option) -> bool:
        return option is not None

    def text(self, key: str) -> str:
        return f"{key} set ({self.what})"


READ_ONLY_BY = {
    # stopexp.training.fit: a statistic has no weights to fit (it is evaluated as is)
    **{f"train.{k}": ("predictor.name", AllBut(UNTRAINED_PREDICTORS))
       for k in ("epochs", "batch_prompts", "lr", "weight_decay", "seed", "early_stopping",
                 "max_prompts", "accumulate", "mixed_only")},
    # stopexp.training.fit: patience counts epochs without a better one, with early stopping
    "train.patience": (("predictor.name", AllBut(UNTRAINED_PREDICTORS)),
                       ("train.early_stopping", (True,))),
    # stopexp.models.prefix_cache: the super token's cache of its prefixes
    "train.prefix_cache_gb": ("predictor.name", ("super_token",)),
    # STEP's budget (stopexp.stopping.step), in every stage, so that the command that makes
    # an evaluation's bank (collect) takes the evaluation's settings
    "engine.kv_budget": ("evaluate.methods", ("step",)),
    "loss.name": ("predictor.name", AllBut(UNTRAINED_PREDICTORS)),
    # a stopping method's settings (stopexp.config.stopping): read when it runs
    **{key: ("evaluate.methods", (m,)) for key, m in setting_keys(TracesStopping, "evaluate.stopping")},
    # the K sweep of the Pareto points: a threshold policy's one point is its run
    # (evaluate.retention under search=beam or several checks: check_sweeps_read)
    "evaluate.retention": ("policy.name", ("topk",)),
    # replay and online Launch-Check-Resume evaluate every prompt of the bank's split
    "evaluate.max_prompts": ("search.name", ("beam",)),
    # stopexp.store.bank_plan: the splits the difficulty band filters
    "collect.keep_correct_splits": ("collect.keep_correct", Given("a band [lo, hi]")),
}
_GROUPS = {g.name: g for g in GROUPS if g.refuse_unread}


def conditions(key: str) -> tuple[tuple[str, Any], ...]:
    """READ_ONLY_BY's conditions for `key`: (the key naming the option, its readers), each."""
    rule = READ_ONLY_BY[key]
    return rule if isinstance(rule[0], tuple) else (rule,)


def _holds(cfg, option_key: str, readers) -> bool:
    option = OmegaConf.select(cfg, option_key)
    return any(o in readers for o in option) if is_list(option) else option in readers


def reads(cfg, key: str) -> bool:
    """Whether the chosen options of `cfg` read `key`."""
    group, _, leaf = key.partition(".")
    if key not in READ_ONLY_BY and group in _GROUPS:
        g = _GROUPS[group]
        option = g.chosen(OmegaConf.select(cfg, group))
        return option in g.options and leaf in g.keys(option)
    return all(_holds(cfg, option_key, readers) for option_key, readers in conditions(key))


def default_in(cfg, key: str) -> Any:
    """The schema default of `key` in `cfg`: a derived one (an interpolation such as
    ${stopexp_retention:${search.n_paths}}) resolved against this config's keys."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(schema(), parent) if parent else schema()
    if not OmegaConf.is_interpolation(node, leaf):
        return schema_default(key)
    # the schema's interpolations are absolute: a node whose parent is cfg resolves them
    # against cfg's keys (copying the whole config for it costs ~50 ms a key)
    probe = OmegaConf.create({leaf: node._get_node(leaf)._value()})
    probe._set_parent(cfg)
    value = probe[leaf]
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def is_set(cfg, key: str) -> bool:
    """Whether `key` holds another value than its default in `cfg` (`default_in`)."""
    return OmegaConf.select(cfg, key) != default_in(cfg, key)


def where_read(key: str, value: Any, *, _root_) -> Any:
    """${stopexp_where_read:KEY,VALUE} in an exp: VALUE where the chosen option reads KEY
    (READ_ONLY_BY), else the default."""
    return value if reads(_root_, key) else default_in(_root_, key)


def unread_by_option(cfg) -> list[tuple[str, str, str]]:
    """The keys of a group's view that its chosen option's schema lacks: (key, the readers
    as a message names them, the chosen option as it names it)."""
    out = []
    for g in _GROUPS.values():
        option = g.chosen(cfg[g.name])
        own = g.keys(option)
        out += [(f"{g.name}.{k}", f"{g.name}={'|'.join(g.readers(k))}", f"{g.name}={option}")
                for k in g.view_keys() if k not in own]
    return out


def unread_by_rule(cfg) -> list[tuple[str, str, str]]:
    """READ_ONLY_BY's keys that the chosen options do not read, named as `unread_by_option`."""
    out = []
    for key in READ_ONLY_BY:
        unmet = [(k, r) for k, r in conditions(key) if not _holds(cfg, k, r)]
        if not unmet:
            continue
        option_key, readers = unmet[0]
        if option_key == "evaluate.methods":
            out.append((key, f"the method {' or '.join(readers)}",
                        f"evaluate.methods without {' or '.join(readers)}"))
        else:  # a group's option by the group's name (predictor=mlp), another key by its own
            label = option_key.split(".")[0] if option_key.endswith(".name") else option_key
            out.append((key, readers.text(label) if hasattr(readers, "text") else
                        f"{label}={'|'.join(map(_shown, readers))}",
                        f"{label}={_shown(OmegaConf.select(cfg, option_key))}"))
    return out


def _shown(value) -> str:
    """A value as a command line writes it (true, not True; null, not None)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _written(value) -> str:
    """A value in a message: a config's as a container; null and booleans as a command line
    writes them, anything else as Python shows it."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return _shown(value) if value is None or isinstance(value, bool) else repr(value)


def check_unread(cfg) -> None:
    """Every key that the chosen options do not read is at its default."""
    for key, readers, chosen in [*unread_by_option(cfg), *unread_by_rule(cfg)]:
        if is_set(cfg, key):
            fail(key, f"{_written(OmegaConf.select(cfg, key))} is read only by {readers}, not "
                      f"under {chosen}; leave it unset (default {_written(default_in(cfg, key))})")


def check_unread_overrides(cfg, overrides) -> None:
    """Every key set on the command line (`overrides`, Hydra's task overrides) is read by
    the chosen options, even at its default value (`check_unread` sees values only): a
    sweep that sets each option's knob writes it as ${stopexp_where_read:KEY,VALUE}."""
    if cfg.stage == "answers_replay":
        return answers_replay.check_unread_overrides(cfg, overrides)
    unread = {key: (readers, chosen) for key, readers, chosen in
              [*unread_by_option(cfg), *unread_by_rule(cfg)]}
    if OmegaConf.is_config(overrides):  # Hydra's record: read as typed, not resolved
        overrides = OmegaConf.to_container(overrides, resolve=False)
    for line in overrides:
        key, _, value = line.lstrip("+~").partition("=")
        if key in unread and not value.startswith("${stopexp_where_read:"):
            readers, chosen = unread[key]
            fail(key, f"set by {line}, but read only by {readers}, not under {chosen}; drop it "
                      f"(or set it as ${{stopexp_where_read:{key},VALUE}}, VALUE where it is read)")


def check_sweeps_read(cfg) -> None:
    """evaluate.retention (the K swept at one top-K check) and evaluate.n_points (no_prune's
    Ns) are the Pareto points of Launch-Check-Resume: beam search has neither, several checks
    no K sweep (each keeps its K of policy.keep). Set there, they would be ignored."""
    s = cfg.search
    checks = check_values(s.check_at)
    for key in ("evaluate.retention", "evaluate.n_points"):
        if not is_set(cfg, key):
            continue
        value = list(OmegaConf.select(cfg, key))
        if s.name == "beam":
            fail(key, f"{value}: search=beam reports one point per method, with no Pareto sweep "
                      f"to read it; leave {key} unset")
        if key == "evaluate.retention" and len(checks) > 1:
            fail(key, f"{value}: with several checks (search.check_at {list(checks)}) each check "
                      "keeps its K of policy.keep and nothing sweeps K; leave evaluate.retention "
                      "unset")


def check_beam_width_read(cfg) -> None:
    """search.beam_width: read by search=beam, and under search=parallel by the plain beam
    search that evaluate.compare_beam=true runs; anywhere else it would be ignored."""
    s = cfg.search
    if s.name != "beam" and not cfg.evaluate.compare_beam and is_set(cfg, "search.beam_width"):
        fail("search.beam_width", f"{s.beam_width} is read only by search=beam or "
                                  f"evaluate.compare_beam=true, not under search={s.name} without "
                                  f"compare_beam; leave it unset (default "
                                  f"{schema_default('search.beam_width')})")


def check_bertscore_model_read(cfg) -> None:
    """evaluate.bertscore_model: read by the text metrics (evaluate.text_metrics=true) and by
    the comparison with plain beam search (evaluate.compare_beam=true); off both, ignored."""
    ev = cfg.evaluate
    if ev.bertscore_model is not None and not (ev.text_metrics or ev.compare_beam):
        fail("evaluate.bertscore_model", f"{ev.bertscore_model!r} is read only with "
                                         "evaluate.text_metrics=true or evaluate.compare_beam=true; "
                                         "leave it unset (default null)")


def check_block_size_read(cfg) -> None:
    """engine.block_size: vLLM's paging unit (engine=vllm), and the unit of STEP's budget
    (engine.kv_budget, read only with the method step); under engine=hf without a budget,
    nothing reads it."""
    e = cfg.engine
    if e.name != "vllm" and e.kv_budget is None and is_set(cfg, "engine.block_size"):
        fail("engine.block_size", f"{e.block_size} is read only by engine=vllm or by STEP's budget "
                                  f"(engine.kv_budget), not under engine={e.name} without "
                                  "engine.kv_budget; leave it unset (default "
                                  f"{schema_default('engine.block_size')})")


def check_score_rule_read(cfg) -> None:
    """search.score_rule combines a path's scores over several checks: with one check
    (search.check_at one prefix) last and running_mean are the same score. (search=beam
    has a rule of its own: stopexp.config.cross.beam_scores_each_step.)"""
    s = cfg.search
    if s.name != "beam" and len(check_values(s.check_at)) == 1 and is_set(cfg, "search.score_rule"):
        fail("search.score_rule", f"{s.score_rule!r} is read only with several checks "
                                  f"(search.check_at a list of prefixes), not with the one check "
                                  f"search.check_at={s.check_at}; leave it unset (default "
                                  f"{schema_default('search.score_rule')!r})")
