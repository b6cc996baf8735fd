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
  batch on the host (stopexp.search.vllm_batches: vLLM's V1 and V2 model runners). Rows
  of draft tokens (speculative decoding) wait for `sample_tokens`, which says which
  drafts were accepted: a rejected draft's state is never stored. A step where no
  watched request is at a wanted position copies nothing from the device.
- Keyed by what it taps. The layers come from the engine's config
  (`additional_config[TAP_CONFIG]`), which vLLM hashes into the key of its compile cache,
  so a graph compiled for one layer set is never loaded for another.

The reader runs where the model runner is, in a vLLM worker (stopexp.search.vllm_workers
drives it from this process, on one GPU or under tensor parallel). A path's feature at
generated position c is the state of the token that fed generated token c (sequence
position prompt_len + c - 1), as the teacher-forced extraction reads it
(stopexp.models.extract); pooling `mean` keeps the running sum of positions 1..c. Attention entropy is not tapped here (vLLM's attention
kernels return no weights): a tap with attention heads is read teacher-forced.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from stopexp.search.taps import decoder_layers
from stopexp.search.vllm_batches import StepRows, runner_rows

log = logging.getLogger(__name__)


@torch.library.custom_op("stopexp::tap_stream", mutates_args=("out",))
def tap_stream(out: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor) -> None:
    """out[:n] = hidden + residual (n: the forward's tokens, at most the buffer's rows)."""
    n = min(hidden.shape[0], out.shape[0])
    out[:n].copy_(hidden[:n] + residual[:n])


@tap_stream.register_fake
def _(out, hidden, residual) -> None:
    return None


# the key of the tapped layers in vLLM's `additional_config`, which its config hash includes
TAP_CONFIG = "stopexp_tap_layers"


def _wrap_layer(layer: torch.nn.Module, out: torch.Tensor) -> None:
    inner = layer.forward

    def forward(*args, **kwargs):
        result = inner(*args, **kwargs)
        hidden, residual = result if isinstance(result, tuple) else (result, torch.zeros_like(result))
        torch.ops.stopexp.tap_stream(out, hidden, residual)
        return result

    layer.forward = forward


TAPPED = "StopexpTapped"  # the tapped twin of architecture A is named TAPPED + A
_CLASSES: dict[str, type] = {}


def tapped_class(architecture: str) -> type:
    """vLLM's model class for `architecture`, subclassed to tap the layers its engine's
    config names (`engine_config(layers)`); built once per process."""
    if architecture in _CLASSES:
        return _CLASSES[architecture]
    from vllm import ModelRegistry

    base = ModelRegistry._try_load_model_cls(architecture)
    if base is None:
        raise ValueError(f"vLLM has no model class for architecture {architecture!r}")

    class Tapped(base):
        def __init__(self, *, vllm_config, prefix: str = ""):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            layers = tuple(vllm_config.additional_config.get(TAP_CONFIG, ()))
            modules = decoder_layers(self)
            text = vllm_config.model_config.hf_text_config
            rows = vllm_config.scheduler_config.max_num_batched_tokens
            ref = next(self.parameters())
            self.stopexp_tap_layers = layers
            # one (rows, H) buffer per layer: a slice of a stacked one would be a view
            self.stopexp_tap_buffers = [torch.zeros(rows, text.hidden_size, dtype=ref.dtype,
                                                    device=ref.device) for _ in layers]
            for i, buf in zip(layers, self.stopexp_tap_buffers):
                _wrap_layer(modules[i], buf)

    Tapped.__name__ = Tapped.__qualname__ = TAPPED + architecture
    Tapped.__module__ = __name__
    _CLASSES[architecture] = Tapped
    return Tapped


def tapped_class_path(architecture: str) -> str:
    """Where vLLM finds the tapped twin of `architecture` in another process (a worker):
    this module's attribute of its name (`__getattr__` builds it)."""
    return f"{__name__}:{TAPPED}{architecture}"


def __getattr__(name: str):
    if name.startswith(TAPPED):
        return tapped_class(name.removeprefix(TAPPED))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tapped_architecture(architecture: str) -> str:
    """Register in this process the tapped twin of `architecture` (the class itself, which
    vLLM inspects here) and return its name, for `hf_overrides={"architectures": [name]}`.
    A worker in another process finds it by its name (stopexp.search.vllm_workers)."""
    from vllm import ModelRegistry

    name = TAPPED + architecture
    model = ModelRegistry.models.get(name)
    if getattr(model, "model_cls", None) is not tapped_class(architecture):
        ModelRegistry.register_model(name, tapped_class(architecture))
    return name


def engine_config(layers: tuple[int, ...]) -> dict:
    """vLLM's `additional_config` for a tapped model of `layers`: part of the config hash
    that keys vLLM's compile cache (pooling is read on the host: the graph is the same)."""
    return {TAP_CONFIG: sorted(set(layers))}


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

    def __init__(self, runner, layers, pooling: str = "last", dtype: str = "float32"):
        if pooling not in ("last", "mean"):
            raise ValueError(f"tap.pooling: {pooling!r} unknown; allowed: last, mean")
        self.runner, self.batch = runner, runner_rows(runner)
        model = runner.get_model()
        built = tuple(getattr(model, "stopexp_tap_layers", ()))
        if not set(layers) <= set(built):
            raise RuntimeError(f"the vLLM engine taps layers {list(built)}, not all of {list(layers)} "
                               "(VllmSettings.tap_layers)")
        log.info("in-engine taps of layers %s read vLLM's %s model runner", list(layers), self.batch.name)
        self.layers = tuple(sorted(layers))  # shallowest first, as stopexp.search.taps.Taps
        self.buffers = [model.stopexp_tap_buffers[built.index(i)] for i in self.layers]
        self.pooling = pooling
        self.dtype = np.dtype(dtype)  # states are kept as featurize stores them (tap.positions.dtype)
        self.watched: dict[str, Watch] = {}
        self._alias: dict[str, str] = {}  # vLLM's internal request id -> ours
        self._internal: dict[str, list[str]] = {}  # ours -> vLLM's, dropped with the watch
        self._drafted: StepRows | None = None  # a step with drafts, read once they are sampled
        self._inner = runner.execute_model, runner.sample_tokens
        runner.execute_model, runner.sample_tokens = self._execute_model, self._sample_tokens

    def close(self) -> None:
        """Unwrap the runner (the buffers stay: the model is compiled with them)."""
        self.runner.execute_model, self.runner.sample_tokens = self._inner
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
        out = self._inner[0](scheduler_output, *args, **kwargs)
        self._drafted = None
        if self.watched and scheduler_output.total_num_scheduled_tokens:
            rows = self.batch.rows(self.runner, scheduler_output)
            if rows.drafts is not None and out is None:
                self._drafted = rows  # which drafts hold: sample_tokens says
            else:
                self._read(rows)
        return out

    def _sample_tokens(self, *args, **kwargs):
        out = self._inner[1](*args, **kwargs)
        rows, self._drafted = self._drafted, None
        if rows is not None:
            self._read(rows, None if out is None else self.batch.sampled(out, rows))
        return out

    def _wanted_rows(self, rows: StepRows, sampled: np.ndarray | None) -> tuple[list[int], list]:
        """The buffer rows to read and their (watch, c): a watched request's generated
        positions (c >= 1), all of them under mean pooling, else those it wants; of its
        drafts, those accepted (sampled - 1; none where `sampled` is None)."""
        index, owners = [], []
        mean = self.pooling == "mean"
        starts, first = rows.starts.tolist(), rows.first.tolist()
        drafts = None if rows.drafts is None else rows.drafts.tolist()
        alias, watched = self._alias, self.watched  # once per step: 256 requests in ~0.1 ms
        for k, rid in enumerate(rows.req_ids):
            ours = alias.get(rid) or self._ours(rid)
            if ours is None:
                continue
            w = watched[ours]
            end = starts[k + 1]
            if drafts is not None and drafts[k]:
                accepted = 0 if sampled is None else max(int(sampled[k]) - 1, 0)
                end -= drafts[k] - min(accepted, drafts[k])
            offset = first[k] - w.prompt_len + 1 - starts[k]  # row -> c
            for row in range(max(starts[k], 1 - offset), end):  # none in a prefill
                c = row + offset
                if mean or w.wanted(c):
                    index.append(row)
                    owners.append((w, c))
        return index, owners

    @torch.no_grad()
    def _read(self, rows: StepRows, sampled: np.ndarray | None = None) -> None:
        index, owners = self._wanted_rows(rows, sampled)
        if not index:
            return  # nothing leaves the device
        at = torch.tensor(index, device=self.buffers[0].device)
        got = torch.stack([b.index_select(0, at) for b in self.buffers], dim=1)
        got = got.cpu().float().numpy()  # (rows, layers, H): the copy in the model's dtype
        if self.pooling == "last":  # rounded as featurize stores them, one array per step
            for (w, c), state in zip(owners, self._stored(got)):
                w.states[c] = state
            return
        for (w, c), state in zip(owners, got):  # mean pooling
            if c <= w.summed:  # a preempted request's recomputed position: counted and kept
                continue
            w.total = state.astype(np.float64) if w.total is None else w.total + state
            w.summed = c
            if w.wanted(c):
                w.states[c] = self._stored(w.total / c)

    def _stored(self, state: np.ndarray) -> np.ndarray:
        if self.dtype == np.float32:
            return state.astype(np.float32, copy=False)
        return state.astype(self.dtype).astype(np.float32)

