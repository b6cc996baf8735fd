"""Loading the LM: the embedded toy Llama or any HF causal LM, frozen, in eval mode."""
from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

import torch

from stopexp.core.errors import ConfigError, UserError
from stopexp.core.config_text import decode_escapes
from stopexp.core.token_text import keep_in_text
from stopexp.models import gguf, toy_lm
from stopexp.runtime.hub import endpoint, offline_by_choice, offline_unless_reachable, reachable

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelNotAvailable(UserError, RuntimeError):
    """The configured model's weights are neither local nor downloadable."""


def pick_device(name: str) -> torch.device:
    if name == "auto":  # one GPU per local rank under torchrun / accelerate launch
        if torch.cuda.is_available():
            return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count()}")
        warn_if_a_gpu_is_unseen()
    return torch.device("cpu" if name == "auto" else name)


@functools.cache
def warn_if_a_gpu_is_unseen() -> None:
    """model.device=auto lands on the CPU: where nvidia-smi lists a GPU all the same (and
    CUDA_VISIBLE_DEVICES does not hide it), say so once, with torch's CUDA build, the usual
    cause being a driver older than it."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return
    gpus = listed_gpus()
    if gpus:
        log.warning("model.device=auto runs on the CPU, but nvidia-smi lists %s: torch %s (%s) "
                    "sees no CUDA device. A driver older than torch's CUDA build is the usual "
                    "cause; scripts/setup.sh checks it (docs/engines.md#install)", gpus[0],
                    torch.__version__, f"CUDA {torch.version.cuda} build" if torch.version.cuda
                    else "a CPU build")


def listed_gpus() -> list[str]:
    """The GPUs `nvidia-smi -L` lists ("GPU 0: NVIDIA H100 ..."); none where it is not on the
    PATH or fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split(" (UUID")[0] for line in out.splitlines() if line.startswith("GPU ")]


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """model.dtype as a torch dtype; `auto` is float32 on a CPU (bfloat16 matmuls there are
    ~2.6x slower), bfloat16 on a GPU that supports it, else float16."""
    if name != "auto":
        return DTYPES[name]
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def resolved_numerics(dtype: str, device: str, on_vllm: bool = False) -> tuple[str, str]:
    """(dtype, device kind) an LM runs in on this machine, `auto` resolved as loading
    resolves it, without loading it: `dtype` (model.dtype, or engine.dtype under vLLM) on
    `device` (model.device); `on_vllm`: the device is vLLM's, a GPU wherever torch sees one."""
    where = pick_device(device)
    kind = ("cuda" if torch.cuda.is_available() else "cpu") if on_vllm else where.type
    return str(pick_dtype(dtype, where)).removeprefix("torch."), kind


def model_dir(model, cache_dir, task, progress: bool = True) -> str:
    """Where the weights of the `model` section come from: the toy LM's directory (made by
    the toy_lm stage under `cache_dir`, or committed), the directory converted from
    `model.gguf_file` (converted if needed, there too) or `model.path` (hub id or local
    directory)."""
    if model.name == "toy":
        return str(toy_lm.find_toy_lm(model.toy, task, cache_dir))
    if model.gguf_file:
        return str(gguf.ensure_gguf(model.gguf_file, cache_dir))
    return model.path


def load_lm(model, cache_dir, task, tap=None, progress: bool = True):
    """(model, tokenizer) for the `model` section (weights: `model_dir`), checked against
    the sizes it states; `tap`: the tap section the LM is read through (None: it only
    generates), whose attention heads need eager attention."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = model
    source = model_dir(model, cache_dir, task, progress)
    device = pick_device(m.device)
    kwargs = {"dtype": pick_dtype(m.dtype, device)}
    log.info("loading %s on %s as %s (model.dtype=%s)", source, device,
             str(kwargs["dtype"]).removeprefix("torch."), m.dtype)
    if m.revision:
        kwargs["revision"] = m.revision
    if m.get("device_map"):  # over every device (accelerate), for a model too big for one
        kwargs["device_map"] = m.device_map
    if m.attn_implementation:
        kwargs["attn_implementation"] = m.attn_implementation
    if tap is not None and tap.get("attention_heads") is not None and m.attn_implementation != "eager":
        log.info("tap.attention_heads is set: loading with eager attention (model.attn_implementation "
                 "%s -> eager), the only one that returns attention weights", m.attn_implementation)
        kwargs["attn_implementation"] = "eager"
    try:
        with offline_unless_reachable(source):  # no hub: the cache only, failing at once
            tokenizer = AutoTokenizer.from_pretrained(source, revision=m.revision)
            lm = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelNotAvailable(not_available_message(source, e)) from e
    prepare_tokenizer(tokenizer, m)
    if not m.get("device_map"):
        lm.to(device)
    lm.eval().requires_grad_(False)
    check_sizes(m, lm)
    return lm, tokenizer


def load_tokenizer(model, cache_dir, task):
    """The tokenizer of the `model` section as `load_lm` prepares it, without the weights."""
    from transformers import AutoTokenizer

    source = model_dir(model, cache_dir, task)
    try:
        with offline_unless_reachable(source):
            tokenizer = AutoTokenizer.from_pretrained(source, revision=model.revision)
    except (OSError, ValueError) as e:
        raise ModelNotAvailable(not_available_message(source, e)) from e
    return prepare_tokenizer(tokenizer, model)


def prepare_tokenizer(tokenizer, model_cfg):
    """The tokenizer as every engine uses it: the chat template off where model.chat_template
    is false, its thinking switch set as model.thinking.enabled says, a thinking model's end
    tag kept in decoded text (stopexp.core.token_text), a pad token (the EOS where it has
    none), left padding."""
    if not model_cfg.chat_template:  # plain prompts even where the tokenizer ships a template
        tokenizer.chat_template = None
    thinking = model_cfg.get("thinking")
    if thinking is not None and thinking.enabled is not None:
        set_thinking_switch(tokenizer, thinking.enabled)
    if thinking is not None and thinking.enabled:  # a special end tag stays in the paths' text
        keep_in_text(tokenizer, [decode_escapes(thinking.end_tag)])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def set_thinking_switch(tokenizer, on: bool) -> None:
    """Fix the chat template's `enable_thinking` switch (Qwen3's) to `on`, by a leading Jinja
    `set`, so that every engine and every re-encoding of a prompt renders the same turn. A
    template without the switch is left as it is when `on` (a model that always thinks,
    as the R1 distills); turning it off there is a ConfigError naming model.thinking.enabled."""
    template = tokenizer.chat_template
    if not isinstance(template, str) or "enable_thinking" not in template:
        if not on:
            raise ConfigError("model.thinking.enabled: false sets the chat template's enable_thinking "
                              f"switch, but {tokenizer.name_or_path or 'the tokenizer'}'s template has "
                              "none; leave model.thinking.enabled unset (or true) for this model")
        return
    tokenizer.chat_template = f"{{%- set enable_thinking = {str(on).lower()} %}}" + template


def not_available_message(source: str, error: Exception) -> str:
    """Why `source` could not be loaded, and the two ways to fix it (the pinned hub client
    installs the `hf` command)."""
    if Path(source).exists():
        where = "from that directory"
    elif offline_by_choice():
        where = "- it is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 is set"
    else:
        where = (f"- it is not in the local Hugging Face cache and the hub ({endpoint()}) "
                 "cannot be reached" if not reachable() else "from the hub")
    detail = (str(error).splitlines() or [""])[0][:160]
    return (f"model.path: cannot load {source!r} {where} ({error.__class__.__name__}: "
            f"{detail}). Download it where you have internet (`hf download {source}`, "
            f"then copy ~/.cache/huggingface/hub) or point model.path at a local copy: "
            f"model.path=/path/to/{source.rstrip('/').split('/')[-1]}")


def check_sizes(model, lm) -> None:
    """The loaded `lm` must match the sizes the `model` section (and the tap layers) assume."""
    c = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
    expected = {"model.hidden_size": model.hidden_size, "model.num_layers": model.num_layers}
    if model.toy is not None:
        expected = {"model.toy.hidden_size": model.toy.hidden_size,
                    "model.toy.num_layers": model.toy.num_layers}
    actual = dict(zip(expected, (c.hidden_size, c.num_hidden_layers)))
    for key, want in expected.items():
        if want is not None and want != actual[key]:
            raise ConfigError(f"{key}: the config says {want} but the loaded model "
                              f"{model.name!r} has {actual[key]}")
