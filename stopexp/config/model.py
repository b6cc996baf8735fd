"""The model group (conf/model/, conf/toy_lm.yaml): the LM (a hub model, a GGUF file or the
embedded toy LM) and how it runs, one schema per kind (toy, hub: `ModelConfig`, the view,
holds both's keys: stopexp.config.options), and its checks."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import OmegaConf

from stopexp.config.options import Group
from stopexp.config.ranges import at_least, fail, within
from stopexp.config.search import MIN_TEMPERATURE
from stopexp.config.task import check_task
from stopexp.config.thinking import ThinkingConfig, check_thinking
from stopexp.core.errors import ConfigError

DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


@dataclass
class ToyLMConfig:
    hidden_size: int = 96
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 288
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 100
    max_steps: int = 6000
    eval_every: int = 200
    screen_prompts: int = 64
    screen_paths: int = 8
    target_accuracy: float = 0.5  # stop once per-path accuracy on screening prompts reaches it
    screen_temperature: float = 1.0
    screen_max_new_tokens: int = 64
    seed: int = 0
    # arith task keys the LM learns where they differ from `task` (a distribution shift:
    # prompts from `task`, the LM trained on these); empty = the studied task
    train_task: Dict[str, Any] = field(default_factory=dict)


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's


@dataclass
class ModelBaseConfig:
    """How any LM runs."""
    name: Optional[str] = "toy"       # recorded in every artifact (hub models: from the path)
    # auto = float32 on a CPU, bfloat16 on a GPU that supports it (else float16)
    dtype: str = "auto"               # auto | float32 | bfloat16 | float16
    device: str = "auto"              # auto = cuda when present, else cpu
    # spread the weights over every device (accelerate's device_map) for a model too big
    # for one: auto | balanced | balanced_low_0 | sequential; None = all on model.device
    device_map: Optional[str] = None
    attn_implementation: Optional[str] = None
    # longest prompt in tokens; None = the model's max_position_embeddings - max_new_tokens
    max_prompt_tokens: Optional[int] = None
    long_prompts: str = "error"       # error (names the prompt) | skip (drops it, logs a count)
    # token budget per forward: rows x (prompt + max_new_tokens) stays within it, so long
    # prompts get fewer rows (with search.max_batch_rows, the smaller wins); None = no budget
    max_batch_tokens: Optional[int] = None
    chat_template: bool = True        # render prompts with the tokenizer's chat template, if any
    # a model that reasons inside <think> ... </think> first (stopexp/config/thinking.py)
    thinking: ThinkingConfig = field(default_factory=ThinkingConfig)


@dataclass
class HubModelConfig(ModelBaseConfig):
    """A hub model or local directory (model=llama | qwen | smollm2), or a GGUF file."""
    path: Optional[str] = None        # hub id or local directory
    # a GGUF checkpoint (a file path, or PACKAGE:FILE for a file shipped in an installed
    # Python package), converted once into a plain HF directory in the cache; excludes `path`
    gguf_file: Optional[str] = None
    revision: Optional[str] = None
    # None = read from the loaded model; set them to check tap layers before loading
    num_layers: Optional[int] = None
    hidden_size: Optional[int] = None


@dataclass
class ToyModelConfig(ModelBaseConfig):
    """The embedded toy LM (model=toy): loaded from its own directory, sized by `toy`."""
    name: Optional[str] = "toy"
    toy: Optional[ToyLMConfig] = None


@dataclass
class ModelConfig(ToyModelConfig, HubModelConfig):
    """Both kinds' keys (the view: what cfg.model holds)."""
    name: Optional[str] = "toy"


# check_model names the options by their files (model=llama|qwen|smollm2 are one schema)
MODEL = Group("model", {"toy": ToyModelConfig, "hub": HubModelConfig}, ModelConfig,
              chosen=lambda m: "toy" if m.name == "toy" else "hub", refuse_unread=False)
# model.* keys the embedded toy LM (model=toy) never reads
TOY_UNREAD = tuple(k for k in MODEL.keys("hub") if k not in MODEL.keys("toy"))


def check_model(cfg) -> None:
    m = cfg.model
    if m.name == "toy" and m.toy is None:
        fail("model.toy", "the toy model needs its `toy:` section (see conf/model/toy.yaml)")
    if m.name == "toy":
        for key in TOY_UNREAD:
            if m[key] is not None:
                fail(f"model.{key}", f"{m[key]!r} is read only by a hub or GGUF model (model=llama|"
                                     "qwen|smollm2); model=toy loads the embedded LM, sized by "
                                     "model.toy: leave it unset")
    elif m.toy is not None:
        fail("model.toy", f"is read only by model=toy, not by model {m.name!r} (loaded from "
                          "model.path or model.gguf_file); drop the toy: section")
    if m.revision and not m.path:
        fail("model.revision", f"{m.revision!r} is a hub revision, read only with model.path "
                               "(a hub id); leave it unset")
    if m.name != "toy" and not m.path and not m.gguf_file:
        fail("model.path", f"model {m.name!r} needs a hub id or local directory (or model.gguf_file)")
    if m.path and m.gguf_file:
        fail("model.gguf_file", "give either model.path or model.gguf_file, not both")
    if not DEVICE.fullmatch(m.device):
        fail("model.device", f"{m.device!r} is not a device; allowed: auto, cpu, mps, cuda, cuda:N")
    if m.device_map is not None and m.device_map not in DEVICE_MAPS:
        fail("model.device_map", f"{m.device_map!r} is not a placement; allowed: null, "
                                 f"{', '.join(DEVICE_MAPS)}")
    for key in ("num_layers", "hidden_size", "max_batch_tokens", "max_prompt_tokens"):
        if m[key] is not None:
            at_least(f"model.{key}", m[key], 1)
    check_thinking(cfg)
    s = cfg.search
    if m.max_batch_tokens is not None and m.max_batch_tokens < s.n_paths * (s.max_new_tokens + 1):
        fail("model.max_batch_tokens", f"{m.max_batch_tokens} cannot hold one prompt's N paths: "
                                       f"needs >= N x (max_new_tokens + 1) = "
                                       f"{s.n_paths * (s.max_new_tokens + 1)} plus the prompt")
    t = m.toy
    if t is not None:
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "batch_size",
                    "max_steps", "eval_every", "screen_prompts", "screen_paths"):
            at_least(f"model.toy.{key}", t[key], 1)
        at_least("model.toy.warmup_steps", t.warmup_steps, 0)
        at_least("model.toy.screen_max_new_tokens", t.screen_max_new_tokens, 2)
        within("model.toy.lr", t.lr, 0, math.inf, low_open=True, high_open=True)
        within("model.toy.target_accuracy", t.target_accuracy, 0, 1)
        at_least("model.toy.screen_temperature", t.screen_temperature, MIN_TEMPERATURE)
        pinned = t.get("train_task") or {}
        allowed = ("n_steps", "operators", "multipliers", "styles", "split_fractions", "seed")
        if [k for k in pinned if k not in allowed]:
            fail("model.toy.train_task", f"{[k for k in pinned if k not in allowed]} are not arith "
                                         f"task keys the toy LM learns; allowed: {', '.join(allowed)}")
        if pinned:  # the task the LM learns must be one the arith task can make
            try:
                check_task(OmegaConf.merge(cfg.task, dict(pinned)))
            except ConfigError as e:
                raise ConfigError(f"model.toy.train_task: {e}") from None
        if t.hidden_size % t.num_heads:
            fail("model.toy.num_heads", f"hidden_size {t.hidden_size} is not divisible by "
                                        f"{t.num_heads} heads")
