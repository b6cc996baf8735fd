"""What a stage builds from the whole config in its first lines, one small function per
object, so that nothing below the stages takes the whole config: each reads the sections
it needs and hands the library one object or a few plain values."""
from __future__ import annotations

from omegaconf import OmegaConf

from stopexp.models import load_lm
from stopexp.runtime.tracking import tracked_run
from stopexp.search.decode import SamplingParams
from stopexp.store.bank_fill import Collection
from stopexp.store.features import FeatureSet, feature_set
from stopexp.store.keys import BankSpec, bank_spec


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


def collection(cfg) -> Collection:
    """What collect fills the bank of `cfg` with."""
    return Collection(bank(cfg), cfg.model, cfg.task, cfg.search, cfg.collect, cfg.reward,
                      cfg.engine, cfg.seed, cfg.paths.cache_dir)


def features(cfg) -> FeatureSet:
    """The features of the bank of `cfg` under its tap."""
    return feature_set(bank(cfg), tap=cfg.tap, search=cfg.search, model=cfg.model, task=cfg.task,
                       cache_dir=cfg.paths.cache_dir)
