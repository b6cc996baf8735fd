"""What this machine can run, checked before any model loads (`check_machine`): the device
model.device names, the model's positions against search.max_new_tokens, and what vLLM
would refuse at start-up (devices or cores for engine.tensor_parallel_size, memory for
engine.cpu_kvcache_space, the model's heads and positions).

The model's shape is read without its weights (`model_shape`): from model.toy, from the
config.json of a local directory or of the hub cache, or from a GGUF file's header; a hub
model not yet downloaded has none, and is checked once it loads. torch is imported only
where a config names a device other than auto / cpu, or engine=vllm. The super token's
prefix cache is sized where its LM has loaded (`prefix_cache_budget`, called by train).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from stopexp.config.ranges import fail
from stopexp.core.names import lookup, names
from stopexp.core.protocol import TOY_CHARS, TOY_SPECIALS

TOY_POSITIONS = 256  # the toy LM's max_position_embeddings (stopexp.models.toy_lm.build_model)
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shape:
    positions: int | None   # max_position_embeddings
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    source: str             # where it was read, for messages
    rope_scaled: bool = False  # config.json's rope_scaling: vLLM may serve more positions
    hidden: int | None = None  # the hidden state's width
    vocab: int | None = None   # the rows of the LM head (the logits' width)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def cuda_devices() -> int:
    import torch

    return torch.cuda.device_count()


def mps_available() -> bool:
    import torch

    return torch.backends.mps.is_available()


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def memory_gib() -> float:
    """The memory this process may use: the machine's, or its cgroup's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            total = min(total, int(Path(limit).read_text().strip()))
        except (OSError, ValueError):  # absent, or "max"
            pass
    return total / 2**30


# ---- the model's shape, without weights ------------------------------------------------------
def _from_config_json(path: Path) -> Shape | None:
    try:
        c = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    c = c.get("text_config") or c
    try:
        heads = int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        return Shape(c.get("max_position_embeddings"), int(c["num_hidden_layers"]), heads,
                     int(c.get("num_key_value_heads") or heads), head_dim, str(path),
                     bool(c.get("rope_scaling")), int(c["hidden_size"]),
                     int(c["vocab_size"]) if c.get("vocab_size") else None)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _gguf_path(spec: str) -> Path | None:
    """The file model.gguf_file names (a path, or PACKAGE:FILE), None when not found (the
    model's loading says why: stopexp.models.gguf.resolve_gguf)."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    package, sep, name = spec.partition(":")
    try:
        found = importlib.util.find_spec(package) if sep and package.isidentifier() else None
    except (ImportError, ValueError):
        return None
    roots = list(found.submodule_search_locations or [Path(found.origin).parent]) if found else []
    return next((Path(r) / name for r in roots if (Path(r) / name).is_file()), None)


_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_INTS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 10: "Q", 11: "q"}


@functools.lru_cache(maxsize=8)  # every validation asks (bounds, positions): read it once
def _from_gguf(path: Path) -> Shape | None:
    """The shape in a GGUF file's header (its key-value pairs, read up to the ones needed;
    the gguf package's reader parses the whole vocabulary first, seconds)."""
    want = ("context_length", "block_count", "attention.head_count", "attention.head_count_kv",
            "embedding_length")
    found: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            def read(fmt):
                return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

            def string():
                return f.read(read("Q")).decode("utf-8", "replace")

            def skip(kind, leaf=""):
                if kind == 8:
                    f.seek(read("Q"), 1)
                elif kind == 9:
                    item, n = read("I"), read("Q")
                    if leaf == "ggml.tokens":  # the vocabulary: its length is all we read
                        found["vocab"] = n
                    if item in _GGUF_SIZES:
                        f.seek(n * _GGUF_SIZES[item], 1)
                    else:
                        for _ in range(n):
                            skip(item)
                else:
                    f.seek(_GGUF_SIZES[kind], 1)

            if f.read(4) != b"GGUF" or read("I") < 2:
                return None
            read("Q")
            for _ in range(read("Q")):  # the key-value pairs
                key, kind = string(), read("I")
                leaf = key.partition(".")[2]
                if leaf in want and kind in _GGUF_INTS:
                    found[leaf] = read(_GGUF_INTS[kind])
                else:
                    skip(kind, leaf)
                if len(found) == len(want) + 1:
                    break
    except (OSError, struct.error, KeyError, ValueError):
        return None
    if any(k not in found for k in want[1:3]) or "embedding_length" not in found:
        return None
    heads = found["attention.head_count"]
    return Shape(found.get("context_length"), found["block_count"], heads,
                 found.get("attention.head_count_kv", heads), found["embedding_length"] // heads,
                 str(path), hidden=found["embedding_length"], vocab=found.get("vocab"))


def model_shape(model, task: str | None = None) -> Shape | None:
    """The LM's shape from the model section, without loading it; None where unknown. The
    toy LM's vocabulary is its tokenizer's for `task` (a task name; None: unknown)."""
    t = model.toy
    if model.name == "toy" and t is not None:
        vocab = len(TOY_SPECIALS) + len(lookup("task", task).toy_chars or TOY_CHARS) \
            if task in names("task") else None
        return Shape(TOY_POSITIONS, t.num_layers, t.num_heads, t.num_heads,
                     max(1, t.hidden_size // max(t.num_heads, 1)), "model.toy",
                     hidden=t.hidden_size, vocab=vocab)
    if model.gguf_file:
        path = _gguf_path(model.gguf_file)
        return _from_gguf(path) if path else None
    if not model.path:
        return None
    local = Path(model.path).expanduser() / "config.json"
    if local.is_file():
        return _from_config_json(local)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model.path, "config.json", revision=model.revision)
    except Exception:  # not a hub id (a missing local directory): its loading says so
        return None
    return _from_config_json(Path(cached)) if isinstance(cached, str) else None


# ---- the checks --------------------------------------------------------------------------------
def check_device(device: str) -> None:
    """model.device names a device this machine has."""
    if device.startswith("cuda"):
        n, index = cuda_devices(), int(device.partition(":")[2] or 0)
        if not n:
            fail("model.device", f"{device!r}: this machine has no CUDA device (torch sees none); "
                                 "use model.device=auto or cpu")
        if index >= n:
            fail("model.device", f"{device!r}: this machine has {n} CUDA device"
                                 f"{'s' if n > 1 else ''} (cuda:0..cuda:{n - 1})")
    if device == "mps" and not mps_available():
        fail("model.device", "'mps': this machine has no MPS device (Apple silicon); use "
                             "model.device=auto or cpu")


def check_attention(attn: str | None) -> None:
    """model.attn_implementation=flash_attention_*: its package is installed, and a CUDA
    device is there (transformers refuses either only as the model loads)."""
    if not attn or not attn.startswith("flash_attention"):
        return
    package = "flash_attn_interface" if attn == "flash_attention_3" else "flash_attn"
    if importlib.util.find_spec(package) is None:
        fail("model.attn_implementation", f"{attn!r} needs the package {package}, which is not "
                                          "installed; use sdpa or eager")
    if not cuda_devices():
        fail("model.attn_implementation", f"{attn!r} runs on CUDA only, and this machine has no "
                                          "CUDA device; use sdpa or eager")


def check_positions(cfg, shape: Shape | None) -> None:
    """search.max_new_tokens leaves room for a prompt in the model's positions (or
    engine.max_model_len), where model.max_prompt_tokens does not set the prompt's room."""
    s, e = cfg.search, cfg.engine
    if shape is None or shape.positions is None or cfg.model.max_prompt_tokens is not None:
        return
    if e.name == "vllm" and e.max_model_len is not None:
        return  # engine.max_model_len is checked against both (check_engine, check_vllm)
    if not s.max_new_tokens < shape.positions:
        fail("search.max_new_tokens", f"{s.max_new_tokens} leaves no room for a prompt in the "
                                      f"{shape.positions} positions of model {cfg.model.name!r} "
                                      f"({shape.source}); allowed: < {shape.positions}")


def check_vllm(cfg, shape: Shape | None) -> None:
    """engine=vllm: what vLLM would refuse when it starts, 15-45 s later."""
    e = cfg.engine
    gpus = cuda_devices()
    tp = e.tensor_parallel_size
    if gpus and tp > gpus:
        fail("engine.tensor_parallel_size", f"{tp} is more than the {gpus} CUDA devices of "
                                            f"this machine; allowed: 1..{gpus}")
    cores = cpu_cores()
    if not gpus and tp > cores:
        fail("engine.tensor_parallel_size", f"{tp} is more than the {cores} CPU cores this "
                                            f"process may use (no CUDA device); allowed: 1..{cores}")
    if shape is not None and shape.heads % tp:
        fail("engine.tensor_parallel_size", f"{tp} does not divide the {shape.heads} attention "
                                            f"heads of {cfg.model.name!r}; give a divisor of them")
    positions = shape.positions if shape is not None else None
    if positions is not None and e.max_model_len is not None and e.max_model_len > positions \
            and not shape.rope_scaled:
        fail("engine.max_model_len", f"{e.max_model_len} is more than the {positions} positions "
                                     f"of model {cfg.model.name!r} ({shape.source}); give at "
                                     "most that, or null")
    length = e.max_model_len or positions
    if e.max_num_batched_tokens is not None and length is not None \
            and e.max_num_batched_tokens < length:
        fail("engine.max_num_batched_tokens", f"{e.max_num_batched_tokens} is below the "
                                              f"{length} tokens of a request (engine.max_model_len "
                                              "or the model's positions): without chunked prefill "
                                              "a step must hold a whole request; give at least "
                                              "that, or null")
    if not gpus and e.block_size % 32:  # the CPU attention kernel's block sizes
        fail("engine.block_size", f"{e.block_size} is not a multiple of 32, which vLLM's CPU "
                                  "attention needs (no CUDA device); give 32, 64 or 128")
    if gpus or e.cpu_kvcache_space is None:
        return  # on a GPU vLLM sizes its cache by gpu_memory_utilization
    space, memory = e.cpu_kvcache_space, memory_gib()
    if space >= memory:
        fail("engine.cpu_kvcache_space", f"{space:g} GiB leaves nothing of this machine's "
                                         f"{memory:.1f} GiB of memory for the model; give less")
    dtype = e.dtype if e.dtype != "auto" else "float32"  # auto: float32 on a CPU
    if shape is not None and length is not None:
        need = shape.kv_bytes_per_token(BYTES[dtype]) * length
        if space * 2**30 < need:
            fail("engine.cpu_kvcache_space", f"{space:g} GiB cannot hold one request of "
                                             f"{length} tokens of {cfg.model.name!r} ({dtype}): "
                                             f"that needs {need / 2**30:.3g} GiB; give more, or "
                                             "a smaller engine.max_model_len")


def check_toy_memory(toy) -> None:
    """The toy LM's training (float32 weights, gradients and AdamW's two moments: 16 bytes
    a parameter; the embeddings are left out, so this is a lower bound) fits in memory."""
    h, n = toy.hidden_size, toy.num_layers
    params = n * (4 * h * h + 3 * h * toy.intermediate_size)
    need, memory = 16 * params / 2**30, memory_gib()
    if need >= memory:
        fail("model.toy", f"{n} layers of hidden_size {h} and intermediate_size "
                          f"{toy.intermediate_size} are {params:.3g} parameters: training them "
                          f"takes {need:.3g} GiB or more, and this machine has {memory:.1f} GiB")


def free_memory_gib(device) -> tuple[float, str]:
    """(GiB, what to call it) of the memory free on a torch device now: a CUDA device's own,
    else this machine's available memory (MemAvailable; the total where it is not known)."""
    if getattr(device, "type", str(device).split(":")[0]) == "cuda":
        import torch

        return torch.cuda.mem_get_info(device)[0] / 2**30, f"free on {device}"
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return min(kib / 2**20, memory_gib()), "available on this machine"
    except (OSError, StopIteration, ValueError, IndexError):
        return memory_gib(), "of this machine's memory"


# the share of the memory free when the super token's training begins that its prefix cache
# leaves free whatever its budget: a training step's working set (the batch's K/V, their
# [STOP] copies, activations, gradients: gigabytes for a batch of 240 SmolLM2 paths of 420
# tokens; with half of 19 GB free as its budget, 1,200 training prompts took the process to
# 21 GB of a 24 GB machine)
PREFIX_CACHE_RESERVE = 0.25


def prefix_cache_budget(setting: float | None, device) -> tuple[float, Callable[[], float], float]:
    """(budget GiB, the GiB free now as a function, reserve GiB): what the super token keeps
    of its prefixes on `device`, where its LM has loaded (`SuperTokenPredictor.keep_prefixes`'s
    arguments). The budget: train.prefix_cache_gb, refused unless below the memory free there
    (a budget is only a cap, so one above it would fail half-way through training); null:
    half of it. The reserve: PREFIX_CACHE_RESERVE of that memory, which the cache leaves free."""
    free, what = free_memory_gib(device)

    def free_now() -> float:
        return free_memory_gib(device)[0]

    if setting and setting >= free:
        fail("train.prefix_cache_gb", f"{setting:g} GiB is not below the {free:.1f} GiB {what} "
                                      "with the LM loaded (the cache lives on the LM's device, "
                                      "beside its training); give less, null (half of it) or 0 "
                                      "(no cache)")
    return (free / 2 if setting is None else setting), free_now, PREFIX_CACHE_RESERVE * free


def check_machine(cfg) -> None:
    """What this machine cannot run, refused before any model loads."""
    check_device(cfg.model.device)
    check_attention(cfg.model.attn_implementation)
    if cfg.model.name == "toy" and cfg.model.toy is not None:
        check_toy_memory(cfg.model.toy)
    shape = model_shape(cfg.model)
    check_positions(cfg, shape)
    if cfg.engine.name == "vllm":
        check_vllm(cfg, shape)
