"""Taps: forward hooks on decoder layers that keep the hidden state of the last position.

Only the last position of each forward is kept (B, layers, H), never the hidden sequence.
The layers are resolved against the loaded model and ordered shallowest first, so
`read()[:, -1]` is the deepest tapped layer whatever order tap.layers lists them in.
Use as a context manager so the hooks are removed on exit, also on error. With
`sequence=True` (teacher-forced feature extraction, `stopexp.store.feature_sets`) every position
of the forward is kept instead: `read()` is (B, T, layers, H), `attention_entropy()` (B, T).

With `attention_heads` ((layer, head) pairs, `stopexp.core.protocol.attention_heads`), hooks on
those layers' attention modules also keep, per row, the entropy (nats) of each chosen
head's attention of the last position over the cached positions; `attention_entropy()`
is their mean. The attention must return its weights, which only eager attention does
(`stopexp.models.load_lm` forces it when tap.attention_heads is set).
"""
from __future__ import annotations

import torch

from stopexp.core import protocol


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
    return protocol.resolve_layers(layers, n_layers)


class Taps:
    def __init__(self, model, layers, pooling: str = "last", attention_heads=None,
                 sequence: bool = False):
        if pooling not in ("last", "mean"):
            raise ValueError(f"tap.pooling: {pooling!r} unknown; allowed: last, mean")
        self.modules = decoder_layers(model)
        self.layers = resolve_layers(layers, len(self.modules))
        self.pooling = pooling
        self.sequence = sequence
        text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.heads = protocol.attention_heads(attention_heads, layers, len(self.modules),
                                            text.num_attention_heads)
        self._captured: dict[int, torch.Tensor] = {}
        self._entropy: dict[int, torch.Tensor] = {}
        self._handles = []

    @classmethod
    def from_config(cls, model, tap_cfg) -> "Taps":
        """The taps of a `tap` config section (layers, pooling, attention_heads)."""
        return cls(model, list(tap_cfg.layers), tap_cfg.pooling, tap_cfg.get("attention_heads"))

    @property
    def attention(self) -> bool:
        """Whether attention entropy is tapped (tap.attention_heads is set)."""
        return bool(self.heads)

    def __enter__(self) -> "Taps":
        for i in self.layers:
            self._handles.append(self.modules[i].register_forward_hook(self._hook(i)))
        for i in sorted({layer for layer, _ in self.heads}):
            heads = [h for layer, h in self.heads if layer == i]
            self._handles.append(self.modules[i].self_attn.register_forward_hook(
                self._attention_hook(i, heads)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._captured.clear()
        self._entropy.clear()

    def _hook(self, i: int):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output  # 4.x: tuple, 5.x: tensor
            self._captured[i] = (hidden if self.sequence else hidden[:, -1, :]).detach()
        return hook

    def _attention_hook(self, i: int, heads: list[int]):
        def hook(module, args, output):
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None:
                raise RuntimeError(
                    f"tap.attention_heads: layer {i}'s attention returned no weights; it needs "
                    "eager attention (model.attn_implementation=eager, which load_lm sets "
                    "when tap.attention_heads is given)")
            query = slice(None) if self.sequence else -1
            p = weights[:, heads, query, :].detach().float()       # (B, heads, [T,] keys)
            self._entropy[i] = -torch.special.xlogy(p, p).sum(-1)   # masked keys: p = 0
        return hook

    def clear(self) -> None:
        self._captured.clear()
        self._entropy.clear()

    def attention_entropy(self) -> torch.Tensor:
        """(B,) mean entropy (nats) of the chosen heads' attention at the last position of
        the last forward ((B, T), every position, with `sequence`). RuntimeError when
        attention is not tapped or saw no forward."""
        if not self.heads:
            raise RuntimeError("attention entropy is not tapped: set tap.attention_heads")
        layers = sorted({layer for layer, _ in self.heads})
        missing = [i for i in layers if i not in self._entropy]
        if missing:
            raise RuntimeError(f"attention taps on layers {missing} saw no forward; are the hooks active?")
        return torch.cat([self._entropy[i] for i in layers], dim=1).mean(1)

    def read(self) -> torch.Tensor:
        """(B, layers, H) hidden state of the last position at each tapped layer ((B, T,
        layers, H), every position, with `sequence`)."""
        missing = [i for i in self.layers if i not in self._captured]
        if missing:
            raise RuntimeError(f"taps on layers {missing} saw no forward; are the hooks active?")
        return torch.stack([self._captured[i] for i in self.layers], dim=-2)
