"""The LM under engine=vllm: its weightless skeleton (config, sizes, EOS ids, the
tokenizer as every engine uses it), the vLLM settings for a config, and the engine
collect generates with (stopexp.search.vllm_engine's, which holds the vLLM side)."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch

from stopexp.core.errors import ConfigError
from stopexp.core.protocol import resolve_layers
from stopexp.core.token_text import stop_token_ids
from stopexp.models import (ModelNotAvailable, check_sizes, model_dir, not_available_message,
                            pick_device, pick_dtype, prepare_tokenizer)
from stopexp.models.extract import StepEnds, position_filter
from stopexp.runtime.hub import offline_unless_reachable
from stopexp.search.stops import eos_ids
from stopexp.search.vllm_engine import VllmEngine, open_llm, settings_of
from stopexp.search.vllm_workers import WorkerTaps


def model_skeleton(model, engine, cache_dir, task):
    """(model, tokenizer) of the `model` section without weights (`model_dir` says where
    from): the model's modules on the meta device, for its config, parameter count, dtype
    (engine.dtype) and EOS ids (vLLM holds the weights, in its own process)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    m = model
    source = model_dir(model, cache_dir, task)
    dtype = pick_dtype(engine.dtype, pick_device(m.device))
    try:
        with offline_unless_reachable(source):
            tokenizer = AutoTokenizer.from_pretrained(source, revision=m.revision)
            config = AutoConfig.from_pretrained(source, revision=m.revision)
            try:
                generation = GenerationConfig.from_pretrained(source, revision=m.revision)
            except OSError:  # a model without generation_config.json
                generation = None
    except (OSError, ValueError) as e:
        raise ModelNotAvailable(not_available_message(source, e)) from e
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if generation is not None:
        lm.generation_config = generation
    check_sizes(m, lm)
    return lm, prepare_tokenizer(tokenizer, m), source, dtype


def vllm_settings(model, engine, cache_dir, task):
    """(settings, model skeleton, tokenizer) of the `model` section under the `engine`
    section (engine=vllm): what `hold` and `open_llm` take, and what the engine needs
    beside the LLM."""
    lm, tokenizer, source, dtype = model_skeleton(model, engine, cache_dir, task)
    text = lm.config.get_text_config()
    tp = engine.tensor_parallel_size
    if text.num_attention_heads % tp:  # vLLM splits the attention heads over the GPUs
        raise ConfigError(f"engine.tensor_parallel_size: {tp} does not divide the "
                          f"{text.num_attention_heads} attention heads of {model.name!r}; give "
                          "a divisor of them")
    return settings_of(engine, source, dtype, text.max_position_embeddings), lm, tokenizer


@contextmanager
def open_vllm_engine(model, engine, cache_dir, task, params, in_process: bool = False, tap=None,
                     positions: dict | None = None):
    """(engine, model skeleton, tokenizer) under engine=vllm (`vllm_settings`), for collect
    or, `in_process`, for online Launch-Check-Resume (VllmSettings.in_process); the LLM is
    shut down on exit unless `hold` keeps it open. With a `tap` section the states of
    tap.layers are tapped inside the engine's workers
    (stopexp.search.vllm_workers) at the generated `positions` (a features position spec:
    checkpoints, stride, step separator; stopexp.store.feature_sets.position_spec)."""
    s, model, tokenizer = vllm_settings(model, engine, cache_dir, task)
    layers = () if tap is None else \
        tuple(resolve_layers(list(tap.layers), model.config.get_text_config().num_hidden_layers))
    with open_llm(replace(s, in_process=in_process, tap_layers=layers)) as llm:
        taps = WorkerTaps(llm, layers, tap.pooling, tap.positions.dtype, positions) if layers else None
        wanted = None if taps is None else \
            position_filter(positions, StepEnds(tokenizer, positions["separator"]))
        # vLLM matches stop strings on text without special tokens: a stop that is one stops by id
        stops = tuple(dict.fromkeys(eos_ids(model, tokenizer) + stop_token_ids(tokenizer, params.stop)))
        try:
            yield VllmEngine(llm, s, params, stops, tokenizer, taps, wanted), \
                model, tokenizer
        finally:
            if taps is not None:
                taps.close()
