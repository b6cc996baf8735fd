"""The tap group (conf/tap/): where features are read (layers, checkpoints, positions,
attention heads), and its checks against the model's depth and search.max_new_tokens."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from stopexp.config.ranges import fail
from stopexp.core.errors import ConfigError
from stopexp.core.limits import count
from stopexp.core.protocol import SYMBOLIC_LAYERS, attention_heads, checkpoint_tokens, layer_index


@dataclass
class TapPositionsConfig:
    # Where features are extracted (stopexp.store.feature_sets), in generated tokens: always
    # tap.checkpoints, plus these checkpoints (fractions of max_new_tokens or token counts),
    # every `stride` tokens, and with `step_ends` every token that ends a reasoning step
    # (the task's step separator: ";" in arith, a newline in text tasks).
    checkpoints: List[float] = field(default_factory=list, metadata=count(
        "max_new_tokens", share=True, below=True))
    stride: Optional[int] = field(default=None, metadata=count("max_new_tokens", below=True))
    step_ends: bool = False
    dtype: str = "float32"  # float32 | float16 (half the bytes)


@dataclass
class TapConfig:
    # decoder layer indices (negative count from the end) or "first" | "mid" | "last",
    # resolved against the loaded model (mid = num_layers // 2)
    layers: List[Any] = field(default_factory=lambda: [-1])
    pooling: str = "last"  # last | mean
    # prefix lengths in generated tokens; values below 1 are fractions of max_new_tokens
    checkpoints: List[float] = field(default_factory=lambda: [0.08, 0.25], metadata=count(
        "max_new_tokens", share=True, below=True))
    # attention entropy (signal attn_entropy): None = off; "all" = every head of the tapped
    # layers; or a list of "layer:head" (layer as in tap.layers). Forces eager attention.
    attention_heads: Any = None
    positions: TapPositionsConfig = field(default_factory=TapPositionsConfig)


def check_layers(tap, n_layers: int | None, n_heads: int | None) -> None:
    """tap.layers and the format of tap.attention_heads (their layers and heads too where
    the config gives the model's depth and heads: the toy LM's)."""
    if not tap.layers:
        fail("tap.layers", "give at least one layer")
    for entry in tap.layers:
        if isinstance(entry, bool) or not isinstance(entry, (int, str)) or (
                isinstance(entry, str) and entry not in SYMBOLIC_LAYERS):
            fail("tap.layers", f"{entry!r} is not a layer; give an index or one of "
                               f"{', '.join(SYMBOLIC_LAYERS)}")
        if n_layers is not None:
            try:
                layer_index(entry, n_layers)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    # the format (and layers, heads where the config knows them) now; the rest at model load
    attention_heads(tap.attention_heads, list(tap.layers), n_layers, n_heads)


def check_checkpoints(tap, max_new_tokens: int) -> list[int]:
    """tap.checkpoints and tap.positions' checkpoints and stride, within max_new_tokens;
    returns tap.checkpoints in tokens."""
    ckpts = []
    for c in tap.checkpoints:
        if not c > 0 or (c >= 1 and c != int(c)):
            fail("tap.checkpoints", f"{c} is neither a fraction in (0, 1) nor a whole token count")
        t = checkpoint_tokens(c, max_new_tokens)
        if not 1 <= t < max_new_tokens:
            fail("tap.checkpoints", f"{c} is prefix {t}, beyond max length "
                                    f"{max_new_tokens} (search.max_new_tokens)")
        ckpts.append(t)
    pos = tap.positions
    for c in pos.checkpoints:
        t = checkpoint_tokens(c, max_new_tokens) if c > 0 else 0
        if not 1 <= t < max_new_tokens or (c >= 1 and c != int(c)):
            fail("tap.positions.checkpoints", f"{c} is not a prefix in 1..{max_new_tokens - 1} "
                                              "tokens (or a fraction in (0, 1) of search.max_new_tokens)")
    if pos.stride is not None and not 1 <= pos.stride < max_new_tokens:
        fail("tap.positions.stride", f"{pos.stride}: give a token count in 1.."
                                     f"{max_new_tokens - 1} (search.max_new_tokens), or null for none")
    return ckpts
