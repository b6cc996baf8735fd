"""Reaching the Hugging Face hub without waiting: when the hub cannot be reached, the hub
clients run offline (local cache only) and fail at once, instead of retrying for about
25 s (datasets) or 55 s (transformers) before saying the same.

One TCP connect to the hub's endpoint (`HF_ENDPOINT`, or the HTTPS proxy when one is set)
with a 3 s timeout decides it, once per process. `HF_HUB_OFFLINE=1` skips the probe.
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import urllib.request
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 3.0


def offline_by_choice() -> bool:
    """HF_HUB_OFFLINE is set to a true value."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


@functools.lru_cache(maxsize=None)
def reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub (or the HTTPS proxy) opens within `timeout` s."""
    if offline_by_choice():
        return False
    from huggingface_hub import constants

    target = urllib.request.getproxies().get("https") or constants.ENDPOINT
    url = urlparse(target if "://" in target else f"http://{target}")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


@contextlib.contextmanager
def offline_unless_reachable(source: str | None = None) -> Iterator[None]:
    """Within the block, huggingface_hub, transformers and datasets work from the local
    cache only when the hub cannot be reached. A `source` that is a local path needs no
    hub: then nothing is probed (the embedded toy LM never touches the network)."""
    if (source is not None and Path(source).expanduser().exists()) or reachable():
        yield
        return
    import datasets.config  # it copies the flag at import
    import huggingface_hub.constants as hub_constants

    flags = [(hub_constants, "HF_HUB_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE")]
    saved = [getattr(mod, name) for mod, name in flags]
    for mod, name in flags:
        setattr(mod, name, True)
    try:
        yield
    finally:
        for (mod, name), value in zip(flags, saved):
            setattr(mod, name, value)
