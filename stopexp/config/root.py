"""The root schema: `Config`, of every group's schema, registered in Hydra's ConfigStore
(`base_config`, which the main configs extend; `<option>_schema` per option of the groups
whose options read different keys, `GROUPS`, which conf/<group>/<option>.yaml extends;
`<group>_schema` for the others), and its defaults (`schema_default`). validate() is
stopexp.config.validation's."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from stopexp.config.adapt import AdaptConfig
from stopexp.config.answers_replay import AnswersReplayConfig
from stopexp.config.collect import CollectConfig
from stopexp.config.engine import ENGINE, EngineConfig
from stopexp.config.evaluate import EvaluateConfig
from stopexp.config.loss import LOSS, LossConfig
from stopexp.config.model import MODEL, ModelConfig
from stopexp.config.options import section
from stopexp.config.paths import LoggerConfig, PathsConfig
from stopexp.config.policy import POLICY, PolicyConfig
from stopexp.config.predictor import PREDICTOR, PredictorConfig, TrainConfig
from stopexp.config.reward import REWARD, RewardConfig
from stopexp.config.search import SEARCH, SearchConfig
from stopexp.config.serve import ServeConfig
from stopexp.config.tap import TapConfig
from stopexp.config.task import TASK, TaskConfig

# the groups with one schema per option (stopexp.config.options)
GROUPS = (MODEL, TASK, PREDICTOR, LOSS, POLICY, SEARCH, REWARD, ENGINE)


@dataclass
class Config:
    stage: str = MISSING
    seed: int = 0
    # a group with one schema per option holds its view, typed once composed as the
    # chosen option's schema (stopexp.config.options.section)
    model: Any = section(ModelConfig)
    task: Any = section(TaskConfig)
    tap: TapConfig = field(default_factory=TapConfig)
    predictor: Any = section(PredictorConfig)
    loss: Any = section(LossConfig)
    policy: Any = section(PolicyConfig)
    search: Any = section(SearchConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    reward: Any = section(RewardConfig)
    engine: Any = section(EngineConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    optimized_metric: Optional[str] = None


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="answers_replay_config", node=AnswersReplayConfig)  # its own root
    for group in GROUPS:
        for option, node in group.options.items():
            cs.store(group=group.name, name=f"{option}_schema", node=node)
    for name, node in [("tap", TapConfig), ("logger", LoggerConfig)]:
        cs.store(group=name, name=f"{name}_schema", node=node)


register()


@functools.lru_cache(maxsize=1)
def schema() -> DictConfig:
    """The schema's defaults, built once (building them takes ~50 ms); read-only."""
    out = OmegaConf.structured(Config)
    OmegaConf.set_readonly(out, True)
    return out


def schema_default(key: str) -> Any:
    return OmegaConf.select(schema(), key)
