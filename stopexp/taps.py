"""Taps: forward hooks on decoder layers that keep the hidden state of the last position.

Only the last position of each forward is kept (B, layers, H), never the hidden sequence.
The layers are resolved against the loaded model and ordered shallowest first, so
`read()[:, -1]` is the deepest tapped layer whatever order tap.layers lists them in.
Use as a context manager so the hooks are removed on exit, also on error.
"""
from __future__ import annotations

import torch

from stopexp import config


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layers of an HF causal LM (Llama, Qwen, Mistral, ... layouts)."""
    base = getattr(model, "model", model)
    base = getattr(base, "language_model", base)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"cannot find decoder layers on {type(model).__name__}: "
                         "expected model.model.layers")
    return layers


def resolve_layers(layers, n_layers: int) -> list[int]:
    """Tap layer entries (indices, negative from the end, or first | mid | last) as
    distinct indices in 0..n_layers-1, shallowest first: the last tap is always the
    deepest tapped layer. ValueError names tap.layers for a layer outside the model."""
    return config.resolve_layers(layers, n_layers)


class Taps:
    def __init__(self, model, layers, pooling: str = "last"):
        if pooling not in ("last", "mean"):
            raise ValueError(f"tap.pooling: {pooling!r} unknown; allowed: last, mean")
        self.modules = decoder_layers(model)
        self.layers = resolve_layers(layers, len(self.modules))
        self.pooling = pooling
        self._captured: dict[int, torch.Tensor] = {}
        self._handles = []

    def __enter__(self) -> "Taps":
        for i in self.layers:
            self._handles.append(self.modules[i].register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._captured.clear()

    def _hook(self, i: int):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output  # 4.x: tuple, 5.x: tensor
            self._captured[i] = hidden[:, -1, :].detach()
        return hook

    def clear(self) -> None:
        self._captured.clear()

    def read(self) -> torch.Tensor:
        """(B, layers, H) hidden state of the last position at each tapped layer."""
        missing = [i for i in self.layers if i not in self._captured]
        if missing:
            raise RuntimeError(f"taps on layers {missing} saw no forward; are the hooks active?")
        return torch.stack([self._captured[i] for i in self.layers], dim=1)
