"""The loss group (conf/loss/): what a predictor is trained on. One schema per loss with its
checks beside it; `LossConfig`, the view, holds every loss's keys (stopexp.config.options)."""
from __future__ import annotations

from dataclasses import dataclass

from stopexp.config.options import Group
from stopexp.config.ranges import at_least, within


@dataclass
class LossBaseConfig:
    """What every loss reads."""
    name: str = "contrastive"  # contrastive | pairwise | reward_regression | mse
    length_reg: float = 0.0    # weight of the score<->prefix-length correlation penalty

    @staticmethod
    def ranges(loss) -> None:
        at_least("loss.length_reg", loss.length_reg, 0)


@dataclass
class PairLossConfig(LossBaseConfig):
    """What the losses over pairs of paths read."""
    min_gap: float = 0.0       # pairs whose reward gap is <= this are skipped

    @staticmethod
    def ranges(loss) -> None:
        at_least("loss.min_gap", loss.min_gap, 0)


@dataclass
class ContrastiveLossConfig(PairLossConfig):
    """relu(margin * reward gap - score gap) over pairs ordered by reward (a 0/1 outcome
    has gap 1: the plain margin)."""
    name: str = "contrastive"
    margin: float = 1.0

    @staticmethod
    def ranges(loss) -> None:
        at_least("loss.margin", loss.margin, 0)


@dataclass
class PairwiseLossConfig(PairLossConfig):
    name: str = "pairwise"


@dataclass
class RewardRegressionLossConfig(LossBaseConfig):
    name: str = "reward_regression"
    # the target: mc, the Monte Carlo label (collect.mc_rollouts) where the bank has one,
    # else the path's reward | reward, the path's reward only (hard labels: its 0/1 outcome)
    labels: str = "mc"


@dataclass
class MSELossConfig(LossBaseConfig):
    name: str = "mse"
    discount: float = 0.95     # the reward discounted by the tokens still to go

    @staticmethod
    def ranges(loss) -> None:
        within("loss.discount", loss.discount, 0, 1, low_open=True)


@dataclass
class LossConfig(MSELossConfig, RewardRegressionLossConfig, PairwiseLossConfig,
                 ContrastiveLossConfig):
    """Every loss's keys (the view: what cfg.loss holds)."""
    name: str = "contrastive"


LOSS = Group("loss", {"contrastive": ContrastiveLossConfig, "pairwise": PairwiseLossConfig,
                      "reward_regression": RewardRegressionLossConfig, "mse": MSELossConfig},
             LossConfig)


def check_loss(loss) -> None:
    LOSS.check(loss)
