"""The reward group (conf/reward/): a path's reward. One schema per reward with its checks
beside it; `RewardConfig`, the view, holds every reward's keys (stopexp.config.options).
An external reward's function is looked up in the registry of stopexp.core.names (register_reward, re-exported
by stopexp.tasks.rewards), which imports a `module:function` by name; an evaluate reward's
module is loaded here (stopexp.core.evaluate_modules: local path or the evaluate cache), so
that a missing one fails before any compute."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from stopexp.config.options import Group
from stopexp.config.ranges import fail
from stopexp.core.evaluate_modules import load_module
from stopexp.core.names import resolve_external


@dataclass
class RewardBaseConfig:
    """A path's reward (stopexp/tasks/rewards.py): stored in the bank beside its outcome, the
    label of the losses and the target of Monte Carlo rollouts (their mean reward)."""
    name: str = "correct"   # correct | rouge_l | bleu | bertscore | neg_perplexity | external | evaluate


@dataclass
class CorrectRewardConfig(RewardBaseConfig):
    name: str = "correct"


@dataclass
class RougeLRewardConfig(RewardBaseConfig):
    name: str = "rouge_l"


@dataclass
class BLEURewardConfig(RewardBaseConfig):
    name: str = "bleu"


@dataclass
class BERTScoreRewardConfig(RewardBaseConfig):
    name: str = "bertscore"
    bertscore_model: Optional[str] = None  # None = the bundled offline MiniLM

    @staticmethod
    def ranges(r) -> None:
        bert = r.bertscore_model
        if bert and bert.startswith(("/", ".", "~")) and not Path(bert).expanduser().is_dir():
            fail("reward.bertscore_model", f"{bert!r} is no model directory; give a local directory, "
                                           "a hub id, or leave it unset for the bundled MiniLM")


@dataclass
class NegPerplexityRewardConfig(RewardBaseConfig):
    name: str = "neg_perplexity"


@dataclass
class ExternalRewardConfig(RewardBaseConfig):
    name: str = "external"
    function: Optional[str] = None        # a registered name or "module:function"

    @staticmethod
    def needs(r) -> None:
        if not r.function:
            fail("reward.function", "reward=external needs a function: a name registered with "
                                    "stopexp.tasks.rewards.register_reward, or module:function")
        try:
            resolve_external(r.function)
        except ValueError as e:
            fail("reward.function", str(e))


@dataclass
class EvaluateRewardConfig(RewardBaseConfig):
    """A Hugging Face `evaluate` module's value for the path's text against the references."""
    name: str = "evaluate"
    module: Optional[str] = None  # a local module path, or a name in the evaluate cache
    key: Optional[str] = None     # the result key; None = the module's name, or its only key

    @staticmethod
    def needs(r) -> None:
        if not r.module:
            fail("reward.module", "reward=evaluate needs a module: a local path (a .py file or its "
                                  "directory) or a name in the evaluate cache, e.g. reward.module=bleu")
        try:
            load_module(r.module)
        except ValueError as e:
            fail("reward.module", str(e))


@dataclass
class RewardConfig(EvaluateRewardConfig, ExternalRewardConfig, NegPerplexityRewardConfig,
                   BERTScoreRewardConfig, BLEURewardConfig, RougeLRewardConfig, CorrectRewardConfig):
    """Every reward's keys (the view: what cfg.reward holds)."""
    name: str = "correct"


REWARD = Group("reward", {
    "correct": CorrectRewardConfig, "rouge_l": RougeLRewardConfig, "bleu": BLEURewardConfig,
    "bertscore": BERTScoreRewardConfig, "neg_perplexity": NegPerplexityRewardConfig,
    "external": ExternalRewardConfig, "evaluate": EvaluateRewardConfig}, RewardConfig)


def check_reward(r) -> None:
    """reward.*: an external reward names a registered or importable function, an evaluate
    reward a loadable module. (The losses' need for a reward in [0, 1]: stopexp.config.cross.)"""
    REWARD.check(r)
