"""Hidden states of running vLLM requests, tapped inside the engine: no second model, no fork.

Design (it holds under torch.compile and CUDA graphs, not only in eager mode):
- In the graph. vLLM builds the model from a class stopexp registers with its model
  registry (`tapped_architecture`: a subclass of vLLM's own class for the checkpoint's
  architecture, selected through `hf_overrides`). Its constructor wraps the forward of
  each tapped decoder layer so that the layer's residual stream (vLLM's layers return
  (MLP output, residual); their sum is what a Hugging Face layer returns) is copied into a
  static buffer by `stopexp::tap_stream`, a custom op that declares the write. The wrap
  exists before vLLM compiles or captures anything, so the copy is part of every compiled
  graph and of every captured CUDA graph: replaying a graph refills the same buffer.
- Outside the graph. The model runner's `execute_model` is wrapped so that after each
  forward, still in the engine's step, the rows of the watched requests are read out of
  the buffer: which request owns which row and at which position comes from the runner's
  batch (`input_batch.req_ids`, `query_start_loc`, `positions`), as vLLM laid it out.

The engine core must run in this process (`VllmSettings.in_process`): the buffer and the
runner live where the model runs. A path's feature at generated position c is the state
of the token that fed generated token c (sequence position prompt_len + c - 1), as the
teacher-forced extraction reads it (stopexp.models.extract); pooling `mean` keeps the
running sum of positions 1..c. Attention entropy is not tapped here (vLLM's attention
kernels return no weights): a tap with attention heads is read teacher-forced.

The runner attributes read are those of vLLM's v1 GPU/CPU model runners (0.1x-0.3x).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from stopexp.search.taps import decoder_layers

log = logging.getLogger(__name__)


@torch.library.custom_op("stopexp::tap_stream", mutates_args=("out",))
def tap_stream(out: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor) -> None:
    """out[:n] = hidden + residual (n: the forward's tokens, at most the buffer's rows)."""
    n = min(hidden.shape[0], out.shape[0])
    out[:n].copy_(hidden[:n] + residual[:n])


@tap_stream.register_fake
def _(out, hidden, residual) -> None:
    return None


class _Plan:
    """What the model class taps: set before vLLM builds the model (in this process)."""
    layers: tuple[int, ...] = ()


def _wrap_layer(layer: torch.nn.Module, out: torch.Tensor) -> None:
    inner = layer.forward

    def forward(*args, **kwargs):
        result = inner(*args, **kwargs)
        hidden, residual = result if isinstance(result, tuple) else (result, torch.zeros_like(result))
        torch.ops.stopexp.tap_stream(out, hidden, residual)
        return result

    layer.forward = forward


def tapped_architecture(architecture: str, layers: tuple[int, ...]) -> str:
    """Register (in this process) a model class that taps `layers` of vLLM's class for
    `architecture`, and return its name, for `hf_overrides={"architectures": [name]}`."""
    from vllm import ModelRegistry

    name = f"StopexpTapped{architecture}"
    _Plan.layers = tuple(layers)
    if name in ModelRegistry.get_supported_archs():
        return name
    base = ModelRegistry._try_load_model_cls(architecture)
    if base is None:
        raise ValueError(f"vLLM has no model class for architecture {architecture!r}")

    class Tapped(base):
        def __init__(self, *, vllm_config, prefix: str = ""):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            modules = decoder_layers(self)
            text = vllm_config.model_config.hf_text_config
            rows = vllm_config.scheduler_config.max_num_batched_tokens
            ref = next(self.parameters())
            self.stopexp_tap_layers = _Plan.layers
            # one (rows, H) buffer per layer: a slice of a stacked one would be a view
            self.stopexp_tap_buffers = [torch.zeros(rows, text.hidden_size, dtype=ref.dtype,
                                                    device=ref.device) for _ in _Plan.layers]
            for i, buf in zip(_Plan.layers, self.stopexp_tap_buffers):
                _wrap_layer(modules[i], buf)

    Tapped.__name__ = Tapped.__qualname__ = name
    ModelRegistry.register_model(name, Tapped)
    return name


@dataclass
class Watch:
    """One watched request: its prompt length, which generated positions to keep
    (`wanted(c)`; mean pooling keeps the running mean at those), and what was read."""
    prompt_len: int
    wanted: Callable[[int], bool]
    states: dict = field(default_factory=dict)   # c -> (layers, H) float32
    total: np.ndarray | None = None               # mean pooling: sum over positions 1..c
    summed: int = 0                               # the last position in `total`


class EngineTaps:
    """Reads the tapped states (`layers`, a subset of those the model was built with) of
    watched requests after every forward of an in-process vLLM engine whose model class is
    `tapped_architecture`'s, rounded to `dtype` as featurize stores them (float32 arrays).
    `close` unwraps the runner."""

    def __init__(self, llm, layers, pooling: str = "last", dtype: str = "float32"):
        if pooling not in ("last", "mean"):
            raise ValueError(f"tap.pooling: {pooling!r} unknown; allowed: last, mean")
        self.runner = model_runner(llm)
        model = self.runner.get_model()
        built = tuple(getattr(model, "stopexp_tap_layers", ()))
        if not set(layers) <= set(built):
            raise RuntimeError(f"the vLLM engine taps layers {list(built)}, not all of {list(layers)} "
                               "(VllmSettings.tap_layers)")
        self.layers = tuple(sorted(layers))  # shallowest first, as stopexp.search.taps.Taps
        self.buffers = [model.stopexp_tap_buffers[built.index(i)] for i in self.layers]
        self.pooling = pooling
        self.dtype = np.dtype(dtype)  # states are kept as featurize stores them (tap.positions.dtype)
        self.watched: dict[str, Watch] = {}
        self._alias: dict[str, str] = {}  # vLLM's internal request id -> ours
        self._internal: dict[str, list[str]] = {}  # ours -> vLLM's, dropped with the watch
        self._inner = self.runner.execute_model
        self.runner.execute_model = self._execute_model

    def close(self) -> None:
        """Unwrap the runner (the buffers stay: the model is compiled with them)."""
        self.runner.execute_model = self._inner
        self.watched.clear()

    def watch(self, request_id: str, prompt_len: int, wanted: Callable[[int], bool]) -> Watch:
        self.watched[request_id] = w = Watch(prompt_len, wanted)
        return w

    def forget(self, request_id: str) -> Watch | None:
        for rid in self._internal.pop(request_id, ()):
            self._alias.pop(rid, None)
        return self.watched.pop(request_id, None)

    def _ours(self, rid: str) -> str | None:
        if rid not in self._alias:  # vLLM appends "-<random>" to the id a request was added with
            base = rid if rid in self.watched else rid.rsplit("-", 1)[0]
            if base not in self.watched:
                return None  # not remembered: unwatched requests come and go
            self._alias[rid] = base
            self._internal.setdefault(base, []).append(rid)
        return self._alias[rid]

    def _execute_model(self, scheduler_output, *args, **kwargs):
        out = self._inner(scheduler_output, *args, **kwargs)
        if self.watched and scheduler_output.total_num_scheduled_tokens:
            self._read()
        return out

    @torch.no_grad()
    def _read(self) -> None:
        r = self.runner
        n_reqs = r.input_batch.num_reqs
        starts = np.asarray(r.query_start_loc.np[: n_reqs + 1])
        held = r.positions if isinstance(r.positions, torch.Tensor) else r.positions.cpu  # CpuGpuBuffer
        positions = held[: int(starts[-1])].to("cpu").numpy()
        rows, owners = [], []
        for k, rid in enumerate(r.input_batch.req_ids[:n_reqs]):
            ours = self._ours(rid)
            if ours is None:
                continue
            w = self.watched[ours]
            start = int(starts[k])
            generated = positions[start: int(starts[k + 1])] - (w.prompt_len - 1)  # c per row
            for i in np.nonzero(generated >= 1)[0]:  # one row per decode step; none in a prefill
                c = int(generated[i])
                if self.pooling == "mean" or w.wanted(c):
                    rows.append(start + int(i))
                    owners.append((w, c))
        if not rows:
            return
        index = torch.tensor(rows, device=self.buffers[0].device)
        got = torch.stack([b.index_select(0, index) for b in self.buffers], dim=1)
        got = got.float().cpu().numpy()  # (rows, layers, H)
        if self.pooling == "last":  # rounded as featurize stores them, one array per step
            got = self._stored(got)
        for (w, c), state in zip(owners, got):
            if self.pooling == "mean":
                if c > w.summed:  # a preempted request's recomputed positions count once
                    w.total = state.astype(np.float64) if w.total is None else w.total + state
                    w.summed = c
                if w.wanted(c):
                    w.states[c] = self._stored(w.total / c)
            else:
                w.states[c] = state

    def _stored(self, state: np.ndarray) -> np.ndarray:
        if self.dtype == np.float32:
            return state.astype(np.float32, copy=False)
        return state.astype(self.dtype).astype(np.float32)


def model_runner(llm):
    """The model runner of an LLM whose engine core runs in this process."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("in-engine taps need the vLLM engine core in this process "
                           "(VllmSettings.in_process: VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    return core.model_executor.driver_worker.worker.model_runner
