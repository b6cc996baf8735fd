"""Named random streams: every path, check and shuffle draws from a seed of its own name,
so results do not depend on the order in which they are computed."""
from __future__ import annotations

import hashlib


def stream_seed(*parts) -> int:
    """A 63-bit seed for a random stream named by `parts`, e.g. (seed, prompt, path)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
