"""Hash splits: a prompt's split is a function of its text alone, so train, validation and
test prompts are disjoint by construction, whatever order they are drawn in."""
from __future__ import annotations

import hashlib


def hash_split(text: str, fractions: dict[str, float]) -> str:
    """The split whose share of [0, 1) holds the SHA-256 of `text` read as a fraction;
    `fractions` maps split names to shares in order (they sum to 1)."""
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64
    edge = 0.0
    for split, frac in fractions.items():
        edge += frac
        if h < edge:
            return split
    return list(fractions)[-1]
