"""The reward group (conf/reward/): a path's reward, and its checks. An external reward's
function is looked up in the registry of stopexp.core.names (register_reward, re-exported
by stopexp.tasks.rewards), which imports a `module:function` by name; an evaluate reward's
module is loaded here (stopexp.core.evaluate_modules: local path or the evaluate cache), so
that a missing one fails before any compute."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from stopexp.config.ranges import fail
from stopexp.core.evaluate_modules import load_module
from stopexp.core.names import resolve_external


@dataclass
class RewardConfig:
    """A path's reward (stopexp/tasks/rewards.py): stored in the bank beside its outcome, the
    label of the losses and the target of Monte Carlo rollouts (their mean reward)."""
    name: str = "correct"   # correct | rouge_l | bleu | bertscore | neg_perplexity | external | evaluate
    function: Optional[str] = None        # external: a registered name or "module:function"
    bertscore_model: Optional[str] = None  # bertscore: None = the bundled offline MiniLM
    module: Optional[str] = None  # evaluate: a local module path, or a name in the evaluate cache
    key: Optional[str] = None     # evaluate: the result key; None = the module's name, or its only key


def check_reward(r) -> None:
    """reward.*: an external reward names a registered or importable function; nothing
    else is read unused. (The losses' need for a reward in [0, 1]: stopexp.config.cross.)"""
    if r.name == "external":
        if not r.function:
            fail("reward.function", "reward=external needs a function: a name registered with "
                                    "stopexp.tasks.rewards.register_reward, or module:function")
        try:
            resolve_external(r.function)
        except ValueError as e:
            fail("reward.function", str(e))
    elif r.function:
        fail("reward.function", f"only reward=external reads it, not reward={r.name}; leave it unset")
    if r.name == "evaluate":
        if not r.module:
            fail("reward.module", "reward=evaluate needs a module: a local path (a .py file or its "
                                  "directory) or a name in the evaluate cache, e.g. reward.module=bleu")
        try:
            load_module(r.module)
        except ValueError as e:
            fail("reward.module", str(e))
    for key in ("module", "key"):
        if getattr(r, key) and r.name != "evaluate":
            fail(f"reward.{key}", f"only reward=evaluate reads it, not reward={r.name}; leave it unset")
    if r.bertscore_model and r.name != "bertscore":
        fail("reward.bertscore_model", f"only reward=bertscore reads it, not reward={r.name}")
    bert = r.bertscore_model
    if bert and bert.startswith(("/", ".", "~")) and not Path(bert).expanduser().is_dir():
        fail("reward.bertscore_model", f"{bert!r} is no model directory; give a local "
                                       "directory, a hub id, or leave it unset for the bundled MiniLM")
