"""Which slice of a stage's work this process does, and the launcher's process group.

A module of its own, so that no entry point holds `torch.distributed` as a global: a
launcher (submitit) pickles the `__main__` entry point by value, and cloudpickle fails on
`torch.distributed.config` once the code says `.config` anywhere.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

from stopexp.core.errors import ConfigError


def shard_of(collect) -> tuple[int, int]:
    """(rank, world) of this process: collect.rank / collect.world (a launcher's job array),
    else RANK / WORLD_SIZE (torchrun, accelerate launch), else a single process."""
    c = collect
    rank = c.rank if c.rank is not None else int(os.environ.get("RANK", 0))
    world = c.world if c.world is not None else int(os.environ.get("WORLD_SIZE", 1))
    if not 0 <= rank < world:
        raise ConfigError(f"collect.rank: {rank} must lie in 0..{world - 1} (world {world})")
    return rank, world


def join_group() -> bool:
    """Join the launcher's process group when there is one (WORLD_SIZE > 1). It only serves
    a barrier, so gloo does on CPU and GPU alike; the long timeout lets a rank with nothing
    left to do (a resume) wait for the others."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        return False
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(days=7))
    return True


def in_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    dist.barrier()


def leave_group() -> None:
    if in_group():
        dist.destroy_process_group()
