"""What the stages build from several sections of the whole config at once, one small
function per object; a stage calls them in its first lines and passes the objects down."""
from __future__ import annotations

import functools
from pathlib import Path

from stopexp.core.protocol import checkpoint_tokens
from stopexp.evaluation.online import OnlineLM, run_launch_check_resume, run_on_vllm
from stopexp.models import load_lm
from stopexp.runtime.artifacts import config_hash
from stopexp.search.decode import SamplingParams
from stopexp.search.sample import fit_prompts, prompt_limit, row_cap
from stopexp.store import bank, feature_rows
from stopexp.store import features as feature_bank
from stopexp.tasks import build_task
from stopexp.training import data, per_step


# ---- the predictor's artifacts and data (train, evaluate, adapt) ----------------------------
def predictor_dir(cfg) -> Path:
    """Where the predictor of `cfg` is saved: a hash of its features, predictor, loss and
    train sections under paths.cache_dir."""
    key = config_hash(feature_bank.feature_key(cfg), cfg.predictor, cfg.loss, cfg.train)
    return Path(cfg.paths.cache_dir) / "predictors" / key


def trained_on(cfg) -> dict:
    """What a predictor of `cfg` learns from (stopexp.training.data.trained_on): its trace
    bank and its features, by content."""
    return data.trained_on(bank.bank_dir(cfg), feature_bank.features_dir(cfg))


def training_data(cfg, root: Path, meta: dict, overrides: list[str] | None = None,
                  prefixes: bool = False) -> dict[str, dict]:
    """The predictor's splits from the bank at `root` (`meta` its meta.json) and its
    features (made when missing): at train.checkpoint (with `prefixes`, also the prompts
    and tokens), or with train.positions=all at every stored position."""
    min_gap = data.pair_min_gap(cfg.loss)
    if cfg.train.positions == "all":
        return per_step.split_data_all({s: feature_rows.load_split(cfg, s, overrides)
                                        for s in ("train", "val", "test")
                                        if bank.split_rows(meta, s)}, min_gap)
    ckpt = checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)
    return data.split_data(root, meta, feature_bank.require_features(cfg, overrides), ckpt,
                           cfg.search.n_paths, min_gap, cfg.collect.keep_correct, prefixes)


def position_rows(cfg, split: str, overrides: list[str] | None = None) -> tuple:
    """(the `split` paths of the bank, their position batch: per_step.position_data, None
    when the bank holds none), the features made when missing."""
    ds, feats = feature_rows.load_split(cfg, split, overrides)
    return ds, per_step.position_data(ds, feats)


# ---- the LM run online (evaluate: mode=online, search=beam, compare_beam) ------------------
def online_lm(cfg, split: str, n_prompts: int) -> OnlineLM:
    """The LM of `cfg`, its task, the first `n_prompts` prompts of the task's `split` that
    fit the model (model.long_prompts), the sampling, and Launch-Check-Resume of those
    prompts on the configured engine (engine=vllm: a stepped vLLM engine)."""
    task = build_task(cfg.task, cfg.model.get("thinking"))
    model, tokenizer = load_lm(cfg)
    problems = fit_prompts(tokenizer, task.problems(split, n_prompts), prompt_limit(cfg, model),
                           cfg.model.long_prompts)
    params = SamplingParams.from_config(cfg)
    if cfg.engine.name == "vllm":
        launch = functools.partial(run_on_vllm, cfg, model, tokenizer, task, problems)
    else:
        launch = functools.partial(run_launch_check_resume, model, tokenizer, task, problems,
                                   params=params, search=cfg.search, tap=cfg.tap, seed=cfg.seed,
                                   max_rows=row_cap(cfg, tokenizer, problems))
    return OnlineLM(model, tokenizer, task, problems, params, launch)
