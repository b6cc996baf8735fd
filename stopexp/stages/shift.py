"""The distribution shift adapt runs under: the stream's config and the command-line
overrides that compose it. A stage module, not stopexp/config/adapt.py beside
shifted_config: pinning the toy LM needs the task keys it learns (stopexp.models.toy_lm)."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from stopexp.config import shifted_config
from stopexp.core.commands import override
from stopexp.models.toy_lm import ARITH_KEYS


def target_config(cfg) -> DictConfig:
    """The stream's config: `cfg` with each `adapt.target` key (a dotted config key under
    task, model or search) set to its value. For the toy LM, task keys are pinned to the
    source task (`model.toy.train_task`) when `adapt.pin_lm`, so the target bank is made by
    the same LM, which never saw the target task; without it the LM is the one trained on
    the target (a style mix, `task.styles`, only changes the LM: pinned, it shifts nothing)."""
    tgt = shifted_config(cfg)
    if cfg.adapt.pin_lm and cfg.model.name == "toy" and cfg.model.toy is not None:
        source = OmegaConf.to_container(cfg.task, resolve=True)
        pinned = {k[5:]: source[k[5:]] for k in cfg.adapt.target
                  if k.startswith("task.") and k[5:] in ARITH_KEYS}
        with open_dict(tgt):
            tgt.model.toy.train_task = {**pinned, **dict(cfg.model.toy.train_task)}
    return tgt


def target_overrides(cfg, overrides: list[str]) -> list[str]:
    """The command-line overrides that compose the target bank's config (for the collect
    and train commands printed when it or its predictor is missing)."""
    out = [o for o in overrides if not o.lstrip("+~").startswith("adapt.")]  # also ++adapt.target=...
    tgt = target_config(cfg)
    target = OmegaConf.to_container(cfg.adapt.target, resolve=True)
    out += [override(k, target[k]) for k in target]
    if cfg.model.name == "toy":
        out += [override(f"+model.toy.train_task.{k}", v)
                for k, v in OmegaConf.to_container(tgt.model.toy.train_task).items()
                if k not in cfg.model.toy.train_task]
    return out
