"""KV-cache memory of a pruning run: bytes per cached token from the model's config, the
online meter the search feeds at every forward, and the replay estimate from a schedule.

One cached token costs 2 (keys and values) x layers x kv_heads x head_dim x dtype bytes.
Memory is counted per prompt, as the sum over the prompt's live paths of the tokens each
holds in the cache (its prompt plus the tokens fed so far; left padding, which depends on
how prompts are batched and not on the method, is left out). A method's `peak_kv_bytes`
is the largest such sum over its run's steps and prompts, `mean_peak_kv_bytes` the mean
over prompts of each prompt's peak.

The schedule (replay): paths run in waves (Launch-Check-Resume: one wave of all N; a
sequential method: one wave per window of paths it samples together). Within its wave a
path that generated `length` tokens in all and spent `spent` of them holds
prompt_len + t tokens after step t for every t < length with t <= spent (at t = 0 it holds
the prompt): a path that ends drops out before its last token is fed, a pruned one after
the token of its check. A path with spent = 0 was never launched. This is what the engine
holds (stopexp.search.decode), so replay's estimate equals the online meter.
"""
from __future__ import annotations

import numpy as np
import torch

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def kv_bytes_per_token(model) -> int:
    """Bytes one cached token takes in `model`'s KV cache: 2 x num_hidden_layers x
    num_key_value_heads x head_dim x the bytes of the model's dtype. head_dim defaults to
    hidden_size / num_attention_heads, and kv heads to the attention heads (no GQA)."""
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"kv_bytes_per_token: model dtype {dtype} unknown; allowed: "
                         f"{', '.join(_DTYPE_BYTES)}")
    return 2 * c.num_hidden_layers * kv_heads * head_dim * _DTYPE_BYTES[dtype]


class KVMeter:
    """Per-prompt peak of cached tokens, measured from live decode states. `observe` is
    called after every forward with the number of cached (non-pad) tokens of each row and
    the prompt of each row; a prompt's rows must all be in that one state."""

    def __init__(self):
        self.peak: dict = {}   # prompt -> largest number of cached tokens seen
        # an engine that schedules requests itself (vLLM) queues them when its KV cache is
        # full: request-seconds spent waiting and running, and the preemptions, per `queue`
        self.waiting_s = self.request_s = 0.0
        self.preemptions: int | None = None

    def observe(self, cached: torch.Tensor, prompt_of_row: list) -> None:
        """cached: (B,) cached tokens per row (a decode state's `positions`: its prompt
        plus the tokens fed so far, left padding excluded)."""
        now: dict = {}
        for prompt, n in zip(prompt_of_row, cached.tolist()):
            now[prompt] = now.get(prompt, 0) + n
        for prompt, n in now.items():
            self.peak[prompt] = max(self.peak.get(prompt, 0), n)

    def queue(self, seconds: float, running: int, waiting: int, preempted: int) -> None:
        """One engine step of `seconds` with `running` requests scheduled and `waiting`
        queued (preempted ones included), `preempted` of them preempted in this step."""
        self.waiting_s += seconds * waiting
        self.request_s += seconds * (running + waiting)
        self.preemptions = (self.preemptions or 0) + preempted

    def queue_summary(self) -> dict:
        """metrics.json's queue keys: the share of the requests' time spent waiting (STEP's
        "time waiting", arXiv 2601.09093) and the preemptions; {} where no engine queued."""
        if self.preemptions is None:
            return {}
        return {"waiting_share": self.waiting_s / self.request_s if self.request_s else 0.0,
                "waiting_request_s": self.waiting_s, "preemptions": self.preemptions}


def schedule_peaks(group: np.ndarray, prompt_len: np.ndarray, length: np.ndarray,
                   spent: np.ndarray, wave: np.ndarray | None = None) -> np.ndarray:
    """(G,) the per-prompt peak of cached tokens under the schedule of the module
    docstring. All arrays (P,) per path: its prompt index 0..G-1, prompt tokens, tokens
    generated when run to its end, tokens it spent under the method, and its wave (None:
    one wave)."""
    wave = np.zeros(len(group), np.int64) if wave is None else np.asarray(wave)
    G = int(group.max()) + 1
    peaks = np.zeros(G, np.int64)
    launched = spent > 0
    for g in range(G):
        for w in np.unique(wave[(group == g) & launched]):
            rows = np.nonzero((group == g) & launched & (wave == w))[0]
            last = np.minimum(length[rows] - 1, spent[rows])    # the last step each is held
            t = np.arange(int(last.max()) + 1)
            held = ((t[None, :] <= last[:, None]) * (prompt_len[rows, None] + t[None, :])).sum(0)
            peaks[g] = max(peaks[g], int(held.max()))
    return peaks


def memory_summary(peaks: np.ndarray, bytes_per_token: int, estimated: bool) -> dict:
    """metrics.json's memory keys from per-prompt peaks of cached tokens."""
    b = np.asarray(peaks, np.float64) * bytes_per_token
    return {"peak_kv_bytes": float(b.max()) if len(b) else 0.0,
            "mean_peak_kv_bytes": float(b.mean()) if len(b) else 0.0,
            "kv_estimated": estimated}


def add_memory(results: dict, outcomes: dict, bytes_per_token: int | None) -> None:
    """Add the estimated memory keys to every method of `results` that has no measured
    ones (in place), from its outcome's "kv_peaks" (per-prompt peaks of cached tokens
    under its schedule). Nothing when the bank records no `kv_bytes_per_token`."""
    if not bytes_per_token:
        return
    for name, o in outcomes.items():
        if "peak_kv_bytes" not in results[name] and o.get("kv_peaks") is not None:
            results[name].update(memory_summary(o["kv_peaks"], bytes_per_token, estimated=True))
