"""Hash splits: a prompt's split is a function of its text alone, so train, validation and
test prompts are disjoint by construction, whatever order they are drawn in."""
from __future__ import annotations

import hashlib
import random
from typing import Callable


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


def draw_distinct(seed: str, split: str, n: int, fractions: dict[str, float],
                  draw: Callable[[random.Random], object], key: Callable[[object], str],
                  what: str, skip: int = 0) -> list:
    """The first `n` draws of `draw` (from `random.Random(seed)`) whose `key` text is new and
    hash-splits into `split`, in draw order, after the first `skip` such draws: a generated
    task's problems of one split, deterministic for the seed (those after `skip` share no
    text with the first `skip`, nor with another split's). ValueError for a split not in
    `fractions`, or when 1000 * (n + 10) draws find fewer than n (`what` names what was
    drawn and how to get more)."""
    if split not in fractions:
        raise ValueError(f"split {split!r} unknown; allowed: {', '.join(fractions)}")
    rng = random.Random(seed)
    out, seen = [], set()
    n += skip
    tries = 1000 * (n + 10)
    for _ in range(tries):
        if len(out) >= n:
            break
        drawn = draw(rng)
        text = key(drawn)
        if text not in seen and hash_split(text, fractions) == split:
            seen.add(text)
            out.append(drawn)
    if len(out) < n:
        what, _, hint = what.partition("; ")
        raise ValueError(f"task: cannot draw {n} distinct {split} {what} ({len(out)} found in "
                         f"{tries} draws){'; ' + hint if hint else ''}")
    return out[skip:]
