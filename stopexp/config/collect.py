"""The collect group (conf/collect.yaml): how many prompts and paths the trace bank holds,
and its checks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from stopexp.config.ranges import at_least, fail
from stopexp.core.names import SPLITS


@dataclass
class CollectConfig:
    prompts: Dict[str, int] = field(
        default_factory=lambda: {"train": 200, "val": 50, "test": 200})
    mc_rollouts: int = 0
    keep_correct: Optional[List[int]] = None  # difficulty band [lo, hi] of correct paths
    keep_correct_splits: List[str] = field(default_factory=lambda: ["train", "val"])
    shard_prompts: int = 25
    seed: int = 0
    # this process's slice of the shards (shard index % world == rank); None = from the
    # RANK / WORLD_SIZE that torchrun or accelerate set, else 0 / 1
    rank: Optional[int] = None
    world: Optional[int] = None


def check_collect(cfg) -> None:
    c, s = cfg.collect, cfg.search
    at_least("collect.mc_rollouts", c.mc_rollouts, 0)
    for split, n in c.prompts.items():
        if split not in cfg.task.split_fractions:
            fail("collect.prompts", f"split {split!r} unknown; allowed: "
                                    f"{', '.join(cfg.task.split_fractions)}")
        at_least(f"collect.prompts.{split}", n, 0)
    band = c.keep_correct
    if band is not None and (len(band) != 2 or not 0 <= band[0] <= band[1] <= s.n_paths):
        fail("collect.keep_correct", f"needs [lo, hi] with 0 <= lo <= hi <= N={s.n_paths}, "
                                     f"got {list(band)}")
    bad = [x for x in c.keep_correct_splits if x not in SPLITS]
    if bad:
        fail("collect.keep_correct_splits", f"{bad} unknown; allowed: {', '.join(SPLITS)}")
    # the band exists for training: at every stage, so that no such bank is ever collected
    if band is not None and (band[1] < 1 or band[0] > s.n_paths - 1):
        fail("collect.keep_correct", f"{list(band)} keeps only {'/'.join(c.keep_correct_splits)} "
                                     f"prompts whose N={s.n_paths} paths all fail or all succeed, "
                                     "which leaves train no pair to learn from; use a band within "
                                     f"[1, {max(s.n_paths - 1, 1)}]")
    if band is not None and not c.keep_correct_splits:
        fail("collect.keep_correct", f"{list(band)} filters no split: collect.keep_correct_splits "
                                     "is empty; name the splits it filters, or leave the band unset")
    at_least("collect.shard_prompts", c.shard_prompts, 1)
    if c.world is not None:
        at_least("collect.world", c.world, 1)
    if c.rank is not None and (c.rank < 0 or (c.world is not None and c.rank >= c.world)):
        fail("collect.rank", f"{c.rank} must lie in 0..collect.world-1 (world {c.world})")
