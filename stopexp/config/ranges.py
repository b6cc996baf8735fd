"""The helpers every group's checks use: a key's value, and the range checks that name the
key in their ConfigError (`fail`: "<key>: <message>")."""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from stopexp.core.errors import fail
from stopexp.core.protocol import is_list

__all__ = ["TOGETHER", "at_least", "fail", "get", "is_list", "n_layers_of", "within"]

# the end of a message about a value relative to N that the user set
TOGETHER = ("; change it with search.n_paths, or leave {key} unset: it is derived from "
            "search.n_paths (stopexp.config.derived_*)")


def get(cfg: Any, key: str) -> Any:
    return OmegaConf.select(cfg, key) if isinstance(cfg, DictConfig) else None


def at_least(key: str, value, low) -> None:
    """value >= low (written so that NaN fails)."""
    if value is None or not value >= low:
        fail(key, f"must be >= {low}, got {value}")


def within(key: str, value, low, high, low_open=False, high_open=False) -> None:
    """low <= value <= high, either end open; NaN fails."""
    ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        fail(key, f"must lie in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}, "
                  f"got {value}")


def n_layers_of(model) -> int | None:
    """The LM's depth as far as the config tells: model.toy.num_layers for the toy LM,
    else model.num_layers (None: known only once the model loads)."""
    return model.toy.num_layers if model.toy is not None else model.num_layers
