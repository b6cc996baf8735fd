"""How much of a GPU vLLM takes, decided in one place before it loads (`gpu_memory_fraction`),
and the device memory an engine or a model leaves behind, freed (`release_device_memory`).

vLLM refuses to start when the memory free on its device, read after its own gc and
`empty_cache`, is below gpu_memory_utilization x the device's total
(vllm/v1/worker/utils.py: request_memory). So `engine.gpu_memory_utilization` is read as the
share of each device this process may take with vLLM in it, as vLLM itself counts weights
held outside the engine against its budget: what the process already holds there (the HF
model loaded beside vLLM for engine.taps=false, tap.attention_heads or the super token; an
engine held open) is taken off vLLM's share, so vLLM and the HF model leave the device
what vLLM alone would. A share that cannot fit is refused before vLLM loads, with the
numbers: what the process holds is the whole share, or other processes leave less free than
vLLM's part of it. On a CPU nothing is decided (vLLM's CPU cache is sized by
engine.cpu_kvcache_space).
"""
from __future__ import annotations

import gc
import logging
import math
from dataclasses import dataclass

from stopexp.core.errors import ConfigError

log = logging.getLogger(__name__)

GIB = 2 ** 30
KEY = "engine.gpu_memory_utilization"


@dataclass(frozen=True)
class DeviceMemory:
    """One CUDA device's memory, in bytes, as this process sees it."""
    index: int
    free: int    # free on the device (cudaMemGetInfo): what vLLM compares with its share
    total: int
    held: int    # what this process's torch holds there (memory_reserved, after empty_cache)


def read_device_memory(index: int) -> DeviceMemory:
    import torch

    free, total = torch.cuda.mem_get_info(index)
    return DeviceMemory(index, free, total, torch.cuda.memory_reserved(index))


def release_device_memory() -> None:
    """Collect what no one refers to any more and give the CUDA cache back to the device
    (a stage's model or an engine shut down), so that the next engine finds it free."""
    gc.collect()
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def vllm_fraction(requested: float, devices: list[DeviceMemory]) -> float:
    """The gpu_memory_utilization vLLM is given: `requested` (the process's share of each
    device) less what the process holds there, the smallest over `devices` (one per tensor
    parallel rank); a ConfigError naming engine.gpu_memory_utilization where it cannot fit."""
    fractions = []
    for d in devices:
        where = f"cuda:{d.index}"
        budget, held, free, total = requested * d.total / GIB, d.held / GIB, d.free / GIB, d.total / GIB
        share = requested - d.held / d.total
        if share <= 0:
            raise ConfigError(f"{KEY}: {requested:g} of {where}'s {total:.1f} GiB is "
                              f"{budget:.1f} GiB, and this process already holds {held:.1f} GiB "
                              f"there (a model loaded beside vLLM, or an engine held open); give "
                              f"more than {held / total:.2f}, or load the model on another device")
        if d.free < math.ceil(share * d.total):  # vLLM's own check, on its part of the share
            most = math.floor((d.free + d.held) / d.total * 100) / 100
            raise ConfigError(f"{KEY}: {requested:g} of {where}'s {total:.1f} GiB asks "
                              f"{share * total:.1f} GiB for vLLM (this process holds {held:.1f} "
                              f"GiB there), and {free:.1f} GiB is free (other processes hold "
                              f"{total - free - held:.1f} GiB); give at most {most:.2f}, or free "
                              "the device")
        fractions.append(share)
    fraction = min(fractions)
    return requested if fraction == requested else math.floor(fraction * 10_000) / 10_000


def gpu_memory_fraction(requested: float, tensor_parallel_size: int) -> float:
    """The gpu_memory_utilization to start vLLM with (`vllm_fraction` of devices
    0..tensor_parallel_size-1, read after `release_device_memory`); `requested` unchanged
    where torch sees no CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return requested
    release_device_memory()
    devices = [read_device_memory(i) for i in range(tensor_parallel_size)]
    fraction = vllm_fraction(requested, devices)
    if fraction < requested:
        held = max(devices, key=lambda d: d.held)
        log.info("vLLM takes %.4f of each GPU: %s of %s, less the %.1f GiB this process holds on "
                 "cuda:%d", fraction, KEY, f"{requested:g}", held.held / GIB, held.index)
    return fraction
