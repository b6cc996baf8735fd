"""Which values are allowed, and which keys only some options read (`READ_ONLY_BY`): such a
key is refused off its default where the chosen option ignores it (`check_unread`), and
an exp sets it as ${stopexp_where_read:KEY,VALUE} (`where_read`). A default derived from
other keys (evaluate.retention from search.n_paths) is the one this config derives
(`default_in`)."""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from stopexp.config.ranges import fail, is_list
from stopexp.config.root import schema, schema_default
from stopexp.core.names import PREDICTOR_NAMES, TASK_NAMES
from stopexp.core.protocol import check_values
from stopexp.core.text import TEXT_TOKENIZERS

ALLOWED = {
    "model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "model.long_prompts": ("error", "skip"),
    "task.name": TASK_NAMES,
    "task.format": ("fewshot", "chat"),
    "task.answer_format": ("numeric", "boxed"),
    "task.extraction": ("strict", "flexible"),
    "task.solution_style": ("inline", "lines"),  # stopexp.tasks.wordprob.SOLUTION_STYLES
    "task.tokenize": TEXT_TOKENIZERS,
    "tap.pooling": ("last", "mean"),
    "tap.positions.dtype": ("float32", "float16"),
    "predictor.name": PREDICTOR_NAMES,
    "predictor.statistic": ("l2", "mean", "var"),
    "loss.name": ("contrastive", "pairwise", "reward_regression", "mse"),
    "train.positions": ("checkpoint", "all"),
    "policy.name": ("fixed", "quantile", "topk", "adaptive", "risk"),
    "policy.risk": ("voter", "answer"),
    "search.name": ("parallel", "beam"),
    "logger.name": ("wandb", "none"),
    "logger.mode": ("offline", "online", "disabled"),
    "evaluate.mode": ("replay", "online"),
    "evaluate.vote": ("majority", "weighted", "filtered"),
    "search.score_rule": ("last", "running_mean"),
    "evaluate.select": ("vote", "signal", "lm_score", "oracle"),
    "engine.name": ("hf", "vllm"),
    "engine.dtype": ("auto", "float32", "bfloat16", "float16"),
    "reward.name": ("correct", "rouge_l", "bleu", "bertscore", "neg_perplexity", "external",
                    "evaluate"),
}
# Keys that only some options read: key -> (the key naming the option, the options that
# read it; for evaluate.methods, the methods). Under another option the run would ignore
# the key, so validate refuses any value but the schema default (`_check_unread`). An exp
# sets such a key as ${stopexp_where_read:KEY,VALUE}: VALUE where it is read, else the
# default, so that replacing the exp's option (+exp=toy_datatotext loss=mse) just works.
# Not here: search.beam_width (evaluate.compare_beam reads it under search=parallel:
# check_beam_width_read). A sweep over policies sets each policy's budget with
# ${stopexp_where_read:...} (conf/hparams_search/optuna_toy.yaml, scripts/sweep_policies.sh).
_ARITH, _QA, _WORDPROB = ("arith",), ("qa",), ("wordprob",)
LEARNED_PREDICTORS = tuple(p for p in PREDICTOR_NAMES if p != "statistic")
READ_ONLY_BY = {
    "loss.margin": ("loss.name", ("contrastive",)),
    "loss.min_gap": ("loss.name", ("contrastive", "pairwise")),
    "loss.discount": ("loss.name", ("mse",)),
    "search.patience": ("search.name", ("beam",)),
    # what stopexp.core.policies.build_policy passes to each policy
    "policy.keep": ("policy.name", ("topk",)),
    "policy.tau": ("policy.name", ("fixed", "adaptive")),
    "policy.quantile": ("policy.name", ("quantile",)),
    **{f"policy.{k}": ("policy.name", ("adaptive",)) for k in ("target_prune_rate", "gain")},
    "predictor.statistic": ("predictor.name", ("statistic",)),
    **{f"predictor.{k}": ("predictor.name", ("super_token",))
       for k in ("n_tokens", "lora_rank", "lora_alpha", "lora_targets")},
    **{f"predictor.{k}": ("predictor.name", ("mlp", "fusion", "conf_features"))
       for k in ("hidden", "depth", "dropout")},
    # stopexp.training.fit: a statistic has no weights to fit (it is evaluated as is)
    **{f"train.{k}": ("predictor.name", LEARNED_PREDICTORS)
       for k in ("epochs", "batch_prompts", "lr", "weight_decay", "patience", "seed")},
    "loss.name": ("predictor.name", LEARNED_PREDICTORS),
    # what stopexp.tasks.build_task passes to each task
    **{f"task.{k}": ("task.name", _ARITH) for k in ("n_steps", "operators", "multipliers", "styles")},
    **{f"task.{k}": ("task.name", _QA) for k in ("path", "subset", "source_split", "question_key",
                                                "answer_key", "answer_format", "prompt_template")},
    **{f"task.{k}": ("task.name", _WORDPROB) for k in ("steps", "number_range", "operations",
                                                           "solution_style")},
    **{f"task.{k}": ("task.name", ("wordprob", "datatotext")) for k in ("shots", "format",
                                                                        "instruction")},
    "task.extraction": ("task.name", ("qa", "wordprob")),
    "task.tokenize": ("task.name", ("qa", "wordprob", "datatotext")),  # arith compares characters
    # what stopexp.search.vllm_engine passes to vllm.LLM
    **{f"engine.{k}": ("engine.name", ("vllm",)) for k in (
        "dtype", "max_model_len", "gpu_memory_utilization", "cpu_kvcache_space",
        "tensor_parallel_size", "enable_prefix_caching", "enforce_eager", "seed", "max_logprobs")},
    "evaluate.esc_window": ("evaluate.methods", ("esc",)),
    "evaluate.asc_threshold": ("evaluate.methods", ("adaptive_consistency",)),
    "evaluate.deepconf_warmup": ("evaluate.methods", ("deepconf_online",)),
    **{f"evaluate.combined_{k}": ("evaluate.methods", ("combined",)) for k in (
        "signal", "first", "wave", "threshold", "prune_below", "prune_confidence")},
    "evaluate.deepconf_keep_percent": ("evaluate.methods", ("deepconf_online", "deepconf_top")),
    # the K sweep of the Pareto points: a threshold policy's one point is its run
    # (evaluate.retention under search=beam or several checks: check_sweeps_read)
    "evaluate.retention": ("policy.name", ("topk",)),
    # policy=risk's guarantee
    **{f"policy.{k}": ("policy.name", ("risk",)) for k in ("risk", "alpha", "delta",
                                                               "selection_share")},
}


def reads(cfg, key: str) -> bool:
    option_key, readers = READ_ONLY_BY[key]
    option = OmegaConf.select(cfg, option_key)
    return bool(set(option) & set(readers)) if is_list(option) else option in readers


def default_in(cfg, key: str) -> Any:
    """The schema default of `key` in `cfg`: a derived one (an interpolation such as
    ${stopexp_retention:${search.n_paths}}) resolved against this config's keys."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(schema(), parent) if parent else schema()
    if not OmegaConf.is_interpolation(node, leaf):
        return schema_default(key)
    probe = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    OmegaConf.update(probe, key, node._get_node(leaf)._value(), merge=False)
    return OmegaConf.select(probe, key)


def is_set(cfg, key: str) -> bool:
    """Whether `key` holds another value than its default in `cfg` (`default_in`)."""
    return OmegaConf.select(cfg, key) != default_in(cfg, key)


def where_read(key: str, value: Any, *, _root_) -> Any:
    """${stopexp_where_read:KEY,VALUE} in an exp: VALUE where the chosen option reads KEY
    (READ_ONLY_BY), else the default."""
    return value if reads(_root_, key) else default_in(_root_, key)


def check_unread(cfg) -> None:
    """Every READ_ONLY_BY key that the chosen option does not read is at its default."""
    for key, (option_key, readers) in READ_ONLY_BY.items():
        if is_set(cfg, key) and not reads(cfg, key):
            value, default = OmegaConf.select(cfg, key), default_in(cfg, key)
            group = option_key.split(".")[-1] if option_key == "evaluate.methods" else option_key.split(".")[0]
            chosen = (f"evaluate.methods without {' or '.join(readers)}" if option_key == "evaluate.methods"
                      else f"{group}={OmegaConf.select(cfg, option_key)}")
            readers_text = (f"the method {' or '.join(readers)}" if option_key == "evaluate.methods"
                            else f"{group}={'|'.join(readers)}")
            shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            fail(key, f"{shown!r} is read only by {readers_text}, not under {chosen}; leave it "
                      f"unset (default {default!r})")


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
