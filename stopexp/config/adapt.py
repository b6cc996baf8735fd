"""The adapt group (conf/adapt.yaml): online fine-tuning from pruning feedback under a
distribution shift, and its checks (run for the adapt stage)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List

from omegaconf import DictConfig, OmegaConf, open_dict

from stopexp.config.ranges import TOGETHER, at_least, fail, within
from stopexp.core.names import ADAPT_VARIANTS, SPLITS, names, runs_the_lm
from stopexp.core.protocol import check_values, checkpoint_tokens, checkpoints_of

# what adapt.target may change (collect.mc_rollouts: Monte Carlo labels in the target bank
# only; collect.prompts: its prompt counts, e.g. a stream longer than the source's test split)
SHIFTABLE = ("task.", "model.", "search.", "collect.mc_rollouts", "collect.prompts")


@dataclass
class AdaptConfig:
    """Online fine-tuning from pruning feedback under a distribution shift (stopexp/stages/adapt.py)."""
    # the shift: dotted config keys (under task, model or search, or collect.mc_rollouts /
    # collect.prompts, the target bank's alone) and the values the stream's config takes,
    # e.g. {task.operators: [+, -]}; empty = no shift
    target: Dict[str, Any] = field(default_factory=dict)
    # toy LM: the target bank is made by the source task's LM (true), or by the LM trained
    # on the target task (false: the LM shifts too, e.g. for another task.styles mix)
    pin_lm: bool = True
    split: str = "test"             # the target bank's split the stream and held-out prompts come from
    stream_prompts: int = 150       # prompts in the stream, in a seeded order
    heldout_prompts: int = 50       # further prompts of that split, scored after every update
    batch_prompts: int = 10         # prompts pruned between two updates
    steps: int = 5                  # gradient steps per update (the train losses)
    lr: float = 1e-3
    weight_decay: float = 0.01
    buffer: int = 4                 # earlier batches of feedback replayed at each update
    explore: float = 0.1            # chance a would-be-pruned live path is finished anyway
    importance_weight: bool = True  # weight explored (and Monte Carlo) feedback by 1 / its chance
    # mc_feedback: pruned prefixes per batch (drawn at random) continued mc_rollouts times
    # from the check; their success rate is their soft label (replay: the bank's `mc`)
    mc_prefixes: int = 20
    mc_rollouts: int = 4
    variants: List[str] = field(default_factory=lambda: [
        "no_prune", "frozen", "kept_only", "explore", "retrained"])
    seed: int = 0


def shifted_config(cfg) -> DictConfig:
    """A copy of `cfg` with every `adapt.target` key set to its value and the target
    emptied (the config of the stream's bank)."""
    import copy

    out = copy.deepcopy(cfg)
    with open_dict(out):
        for key, value in cfg.adapt.target.items():
            OmegaConf.update(out, str(key), value, merge=False, force_add=False)
        out.adapt.target = {}
    return out


def check_adapt(cfg) -> None:
    """adapt.* and what adapt needs of the other groups: one prefix and K under
    search=parallel, a feature predictor, evaluate's selection keys unused. (The stream's
    config, `shifted_config`, is validated after: stopexp.config.validation.)"""
    a, s = cfg.adapt, cfg.search
    ev = cfg.evaluate
    for key, value, default in (("evaluate.vote", ev.vote, "majority"),
                                ("evaluate.select", ev.select, "vote"),
                                ("evaluate.compare_beam", ev.compare_beam, False)):
        if value != default:
            fail(key, f"{value!r} is not used: adapt scores every variant by the majority vote "
                      f"of its finishing paths; leave it {default}")
    missing = object()
    bad = [k for k in a.target if not str(k).startswith(SHIFTABLE)
           or OmegaConf.select(cfg, str(k), default=missing) is missing]
    if bad:
        fail("adapt.target", f"{bad} are not config keys under {', '.join(SHIFTABLE)} "
                             "(give dotted keys, e.g. {task.n_steps: 8})")
    check_mc_feedback(cfg)
    if cfg.policy.name == "risk":
        fail("policy.name", "risk calibrates evaluate's thresholds on the validation prompts; "
                            "adapt keeps the top K of each check: use policy=topk")
    if cfg.predictor.centre_prompts:
        fail("predictor.centre_prompts", "adapt updates the predictor on the paths it revealed (the "
                                         "kept ones), whose mean is not that of all of a prompt's "
                                         "live paths it is scored on; leave it false under adapt")
    if cfg.engine.name == "vllm" and ev.mode == "online":
        fail("evaluate.mode", "'online' adapt forks the hf engine's decode state at the check "
                              "(stopexp.training.online_lm), which engine=vllm does not expose; adapt "
                              "replays the bank (evaluate.mode=replay) or runs online with engine=hf")
    if a.split not in SPLITS:
        fail("adapt.split", f"{a.split!r} unknown; allowed: {', '.join(SPLITS)}")
    for key in ("stream_prompts", "batch_prompts"):
        at_least(f"adapt.{key}", a[key], 1)
    for key in ("heldout_prompts", "steps", "buffer"):
        at_least(f"adapt.{key}", a[key], 0)
    have = shifted_config(cfg).collect.prompts.get(a.split, 0)  # the target bank's
    if a.stream_prompts + a.heldout_prompts > have:
        fail("adapt.stream_prompts", f"{a.stream_prompts} streamed + {a.heldout_prompts} held out "
                                     f"(adapt.heldout_prompts) exceed the {have} {a.split} prompts "
                                     f"of the target bank (collect.prompts.{a.split}, or its "
                                     "adapt.target key)")
    within("adapt.lr", a.lr, 0, math.inf, low_open=True, high_open=True)
    at_least("adapt.weight_decay", a.weight_decay, 0)
    within("adapt.explore", a.explore, 0, 1)
    bad = [v for v in a.variants if v not in ADAPT_VARIANTS]
    if bad or not a.variants:
        fail("adapt.variants", f"{bad or 'empty'}: allowed: {', '.join(ADAPT_VARIANTS)}")
    if "explore" in a.variants and not a.explore > 0:
        fail("adapt.explore", "the explore variant needs a share in (0, 1], got 0 (or drop it "
                              "from adapt.variants)")
    if not 1 <= cfg.policy.keep <= s.n_paths:
        fail("policy.keep", f"retention K={cfg.policy.keep} must lie in 1..N={s.n_paths} "
                            f"(search.n_paths){TOGETHER.format(key='policy.keep')}")
    if s.name != "parallel":
        fail("search.name", f"adapt prunes with Launch-Check-Resume (search=parallel), not {s.name!r}")
    if runs_the_lm(cfg.predictor.name):
        fail("predictor.name", f"adapt updates predictors of stored features ({', '.join(names('predictor'))}); "
                               f"{cfg.predictor.name} would need the LM in the loop")


def check_mc_feedback(cfg) -> None:
    """adapt.mc_prefixes / mc_rollouts; in replay the continuations are the target bank's
    Monte Carlo labels, so that bank must have them, from as many rollouts."""
    a = cfg.adapt
    for key in ("mc_prefixes", "mc_rollouts"):
        at_least(f"adapt.{key}", a[key], 1 if "mc_feedback" in a.variants else 0)
    if "mc_feedback" not in a.variants or cfg.evaluate.mode != "replay":
        return
    have = shifted_config(cfg).collect.mc_rollouts if a.target else cfg.collect.mc_rollouts
    if have != a.mc_rollouts:
        fail("adapt.mc_rollouts", f"mc_feedback replays {a.mc_rollouts} continuations per pruned "
                                  f"prefix from the target bank's Monte Carlo labels, but that bank "
                                  f"is collected with collect.mc_rollouts={have}; give the target "
                                  f"collect.mc_rollouts: {a.mc_rollouts} in adapt.target (or set "
                                  f"adapt.mc_rollouts={have} if > 0, or evaluate.mode=online)")
    m = cfg.search.max_new_tokens
    check = checkpoint_tokens(check_values(cfg.search.check_at)[0], m)
    if check not in checkpoints_of(cfg.tap.checkpoints, m):
        fail("search.check_at", f"{check} tokens: mc_feedback replays the target bank's Monte Carlo "
                                f"labels, which collect rolls out at tap.checkpoints "
                                f"{list(cfg.tap.checkpoints)} only; check at one of them (or set "
                                "evaluate.mode=online)")
