"""The root schema: `Config`, of every group's schema, registered in Hydra's ConfigStore
(`base_config`, which the main configs extend, and `<group>_schema` per group), and its
defaults (`schema_default`). validate() is stopexp.config.validation's."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from stopexp.config.adapt import AdaptConfig
from stopexp.config.collect import CollectConfig
from stopexp.config.engine import EngineConfig
from stopexp.config.evaluate import EvaluateConfig
from stopexp.config.model import ModelConfig
from stopexp.config.paths import LoggerConfig, PathsConfig
from stopexp.config.policy import PolicyConfig
from stopexp.config.predictor import LossConfig, PredictorConfig, TrainConfig
from stopexp.config.reward import RewardConfig
from stopexp.config.search import SearchConfig
from stopexp.config.tap import TapConfig
from stopexp.config.task import TaskConfig


@dataclass
class Config:
    stage: str = MISSING
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    tap: TapConfig = field(default_factory=TapConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    optimized_metric: Optional[str] = None


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, node in [("model", ModelConfig), ("task", TaskConfig), ("tap", TapConfig),
                        ("predictor", PredictorConfig), ("loss", LossConfig),
                        ("policy", PolicyConfig), ("search", SearchConfig),
                        ("logger", LoggerConfig), ("reward", RewardConfig),
                        ("engine", EngineConfig)]:
        cs.store(group=group, name=f"{group}_schema", node=node)


register()


@functools.lru_cache(maxsize=1)
def schema() -> DictConfig:
    """The schema's defaults, built once (building them takes ~50 ms); read-only."""
    out = OmegaConf.structured(Config)
    OmegaConf.set_readonly(out, True)
    return out


def schema_default(key: str) -> Any:
    return OmegaConf.select(schema(), key)
