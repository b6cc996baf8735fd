"""What a stage builds from the whole config in its first lines, one small function per
object, so that nothing below the stages takes the whole config: each reads the sections
it needs and hands the library one object or a few plain values."""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from stopexp.config import PredictorConfig
from stopexp.config.options import filled
from stopexp.config.option_files import find_config_file
from stopexp.core.errors import NotFound
from stopexp.core.names import method_name, predictor_names
from stopexp.core.policies import selection_share
from stopexp.core.protocol import checkpoint_tokens
from stopexp.engines import Sections, backend
from stopexp.evaluation.online import OnlineLM
from stopexp.models import load_lm, load_tokenizer
from stopexp.models.extract import StepEnds
from stopexp.runtime.overrides import CONF_DIR
from stopexp.runtime.tracking import tracked_run
from stopexp.search.decode import SamplingParams
from stopexp.search.sample import fit_prompts, prompt_limit, row_cap
from stopexp.store import bank as bank_store
from stopexp.store import feature_rows
from stopexp.store import feature_sets
from stopexp.store.feature_sets import FeatureSet
from stopexp.store.keys import BankSpec, bank_spec, predictor_key
from stopexp.stopping.step import KVBudget
from stopexp.stopping.step_online import bank_steps
from stopexp.tasks import build_task
from stopexp.training import data, per_step


def tracked(cfg, job_type: str, name: str | None = None):
    """The tracked run of a stage (`stopexp.runtime.tracking.tracked_run`): its logger, its
    output directory and the resolved config as the run records it."""
    return tracked_run(cfg.logger, cfg.paths.output_dir, OmegaConf.to_container(cfg, resolve=True),
                       job_type, name)


def sampling(cfg) -> SamplingParams:
    """How paths are sampled: the search section, the task's stop strings and a thinking
    model's budget."""
    return SamplingParams.from_config(cfg.search, cfg.task, cfg.model.get("thinking"))


def lm(cfg, progress: bool = True):
    """(model, tokenizer): the LM of the model section, read through the tap section."""
    return load_lm(cfg.model, cfg.paths.cache_dir, cfg.task, cfg.tap, progress)


def bank(cfg) -> BankSpec:
    """Where the trace bank of `cfg` lives and what it must record."""
    return bank_spec(model=cfg.model, task=cfg.task, search=cfg.search, collect=cfg.collect,
                     tap=cfg.tap, seed=cfg.seed, reward=cfg.get("reward"), engine=cfg.get("engine"),
                     cache_dir=cfg.paths.cache_dir)


@dataclass(frozen=True)
class Collection:
    """What collect fills a bank with: the bank, and the sections its paths are made by;
    a stage builds it once (stopexp.stages.build.collection)."""
    bank: BankSpec
    model: Any      # the LM
    task: Any       # its questions
    search: Any     # the sampling
    collect: Any    # prompts per split and shard, Monte Carlo rollouts, the difficulty band
    reward: Any
    engine: Any     # hf or vllm
    seed: int
    cache_dir: str  # where the LM's converted or trained weights are cached
    # (generator, model, tokenizer) of the engine for sampling params and an optional tap
    # (stopexp.engines.Backend.open, bound to the model, engine, cache and task sections)
    open_engine: Any
    # the features tapped inside the engine while it generates (stopexp.search.vllm_taps),
    # written beside the bank; None: featurize extracts them from the stored tokens
    features: Any = None


def collection(cfg) -> Collection:
    """What collect fills the bank of `cfg` with."""
    engine = backend(cfg.engine.name)
    return Collection(bank(cfg), cfg.model, cfg.task, cfg.search, cfg.collect, cfg.reward,
                      cfg.engine, cfg.seed, cfg.paths.cache_dir,
                      functools.partial(engine.open, cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task),
                      feature_set(cfg) if engine.taps_in_engine(cfg.engine, cfg.tap) else None)


def feature_set(cfg) -> FeatureSet:
    """The features of the bank of `cfg` under its tap."""
    return feature_sets.feature_set(bank(cfg), tap=cfg.tap, search=cfg.search, model=cfg.model, task=cfg.task,
                       cache_dir=cfg.paths.cache_dir,
                       in_engine=backend(cfg.engine.name).taps_in_engine(cfg.engine, cfg.tap))


# ---- the predictor's artifacts and data (train, evaluate, adapt) ----------------------------
def predictor_dir(cfg, features: FeatureSet) -> Path:
    """Where the predictor of `cfg` is saved: a hash of its `features` (feature_set(cfg)),
    predictor, loss and train sections under paths.cache_dir."""
    # epochs picked on training prompts (policy=risk) make another predictor
    key = predictor_key(features.key, cfg.predictor, cfg.loss, cfg.train, selection_share(cfg.policy))
    return Path(cfg.paths.cache_dir) / "predictors" / key


def with_predictor(cfg, name: str):
    """cfg with predictor/<name>.yaml as its predictor section, the first on the run's
    config search path (conf/, then hydra.searchpath's, where a predictor of another
    package keeps its yaml)."""
    sources = (HydraConfig.get().runtime.config_sources if HydraConfig.initialized()
               else [{"schema": "file", "path": str(CONF_DIR)}])
    found = find_config_file(f"predictor/{name}.yaml", sources)
    if found is None:
        raise NotFound(f"evaluate.methods: {name!r} has no predictor/{name}.yaml on the config "
                       f"search path ({CONF_DIR}, and hydra.searchpath's); add its directory "
                       "with hydra.searchpath=[file:///path/to/conf]")
    node = OmegaConf.load(found)
    node.pop("defaults", None)
    sub = cfg.copy()
    # every built-in predictor's keys at their defaults, and the keys its yaml adds (a
    # predictor of another package has its own)
    sub.predictor = OmegaConf.merge(filled(PredictorConfig), node)
    return sub


def controls(cfg) -> dict[str, Any]:
    """The predictors evaluate scores besides the configured one, by label, each as the
    config that trains it (train makes them, evaluate loads them): every other predictor
    named in evaluate.methods, and under train.positions=all the same predictor trained the
    standard way (at train.checkpoint, without the position input), labelled
    `<predictor>@<tokens>`, which evaluate scores at every position of the bank's paths (not
    under search=beam, whose evaluate reads no stored positions)."""
    out = {}
    for name in dict.fromkeys(method_name(m, cfg.predictor.name) for m in cfg.evaluate.methods):
        if name in predictor_names() and name != cfg.predictor.name:
            out[name] = with_predictor(cfg, name)
    if cfg.train.positions == "all" and cfg.search.name != "beam":
        sub = copy.deepcopy(cfg)
        sub.train.positions, sub.predictor.position_input = "checkpoint", False
        tokens = checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)
        out[f"{cfg.predictor.name}@{tokens}"] = sub
    return out


def training_data(cfg, features: FeatureSet, meta: dict, overrides: list[str] | None = None,
                  prefixes: bool = False) -> dict[str, dict]:
    """The predictor's splits from the trace bank of `features` (feature_set(cfg); `meta` the
    bank's meta.json) and the features (made when missing): at train.checkpoint (with
    `prefixes`, also the prompts and tokens), or with train.positions=all at every stored
    position; the train split of the first train.max_prompts prompts only, and with
    train.mixed_only of those whose paths there have mixed outcomes only."""
    min_gap, limit = data.pair_min_gap(cfg.loss), cfg.train.max_prompts
    if cfg.train.positions == "all":
        out = per_step.split_data_all({s: feature_rows.load_split(features, s, overrides)
                                       for s in ("train", "val", "test")
                                       if bank_store.split_rows(meta, s)}, min_gap, limit)
    else:
        ckpt = checkpoint_tokens(cfg.train.checkpoint, cfg.search.max_new_tokens)
        out = data.split_data(features.bank.root, meta, feature_sets.require_features(features, overrides),
                              ckpt, cfg.search.n_paths, min_gap, prefixes, limit)
    if cfg.train.mixed_only:
        out["train"] = data.mixed_only(out["train"])
    return out


def kv_budget(cfg):
    """engine.kv_budget as STEP reads it (None: unset): the prompt's full blocks are shared
    where vLLM's prefix caching shares them."""
    e = cfg.engine
    if e.kv_budget is None:
        return None
    return KVBudget(float(e.kv_budget), int(e.block_size),
                    e.name == "vllm" and bool(e.enable_prefix_caching), int(cfg.search.max_new_tokens))


def step_boundaries(cfg, features: FeatureSet, split: str, scorer, overrides=None) -> list[list]:
    """STEP's replay input: per bank row of `split` its (position, step probability) at the
    tokens that end a reasoning step (the features stored there: tap.positions.step_ends),
    scored by `scorer`."""
    ds, rows = per_step.position_rows(features, split, overrides)
    if rows is None:
        return [[] for _ in range(len(ds))]
    tokenizer = load_tokenizer(cfg.model, cfg.paths.cache_dir, cfg.task)
    separator = build_task(cfg.task, cfg.model.get("thinking")).step_separator
    return bank_steps(rows, ds["tokens"][:], StepEnds(tokenizer, separator), scorer(rows), len(ds))


# ---- the LM run online (evaluate: mode=online, search=beam, compare_beam) ------------------
def online_lm(cfg, split: str, n_prompts: int, progress: bool = True,
              weights: bool = False) -> OnlineLM:
    """The LM of `cfg` as its engine runs online (stopexp.engines.Backend.load; with
    `weights`, loaded with its weights whatever the engine: beam search runs its beams on
    stopexp's engine), its task, the first `n_prompts` prompts of the task's `split` that
    fit the model (model.long_prompts), the sampling, and Launch-Check-Resume of those
    prompts on the configured engine."""
    engine = backend(cfg.engine.name)
    task = build_task(cfg.task, cfg.model.get("thinking"))
    model, tokenizer = lm(cfg, progress) if weights else \
        engine.load(cfg.model, cfg.engine, cfg.paths.cache_dir, cfg.task, cfg.tap, progress)
    problems = fit_prompts(tokenizer, task.problems(split, n_prompts),
                           prompt_limit(cfg.model, cfg.search, cfg.get("engine"), model),
                           cfg.model.long_prompts)
    params = sampling(cfg)
    sections = Sections(cfg.model, cfg.engine, cfg.task, cfg.search, cfg.tap, cfg.seed,
                        cfg.paths.cache_dir)
    bound = dict(sections=sections, params=params,
                 max_rows=row_cap(cfg.search, cfg.model, tokenizer, problems))
    launch = functools.partial(engine.online, model, tokenizer, task, problems, **bound)
    stop = functools.partial(engine.stopping, model, tokenizer, task, problems, **bound)
    return OnlineLM(model, tokenizer, task, problems, params, launch,
                    functools.partial(row_cap, cfg.search, cfg.model, tokenizer), stop)
