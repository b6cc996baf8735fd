"""The protocol's arithmetic, from plain config values: checkpoints as token counts, the
Launch-Check-Resume plan (check_plan), DeepConf's warm-up, the defaults derived from
search.n_paths (the resolvers ${stopexp_keep:}, ${stopexp_retention:}, ${stopexp_n_points:}),
and tap layers resolved against a model's depth. Torch-free, so config can check them
and every layer can use them."""
from __future__ import annotations

import math
import re
from typing import Any

from omegaconf import ListConfig, OmegaConf

from stopexp.core.errors import fail

SYMBOLIC_LAYERS = ("first", "mid", "last")
# the embedded toy LM's character tokenizer (stopexp.models.tokenizer): its special tokens
# and its default alphabet (a task may give its own: Task.toy_chars)
TOY_SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
TOY_CHARS = "0123456789+-*=;#?"


# Defaults that only make sense relative to N = search.n_paths are derived from it, so a
# run shrunk to search.n_paths=8 needs no other edit: K = round(sqrt(N)) (8 of 64, 4 of 16,
# 3 of 8), the retentions K/2, K, 2K and the Pareto Ns K, N/2, N (within 1..N).
def derived_keep(n_paths: int, check_at: Any = None, policy: str = "topk") -> Any:
    """policy.keep's default: K = round(sqrt(N)); with several checks under policy=topk one
    K per check, doubling backwards from the last (64 paths, 2 checks: [16, 8])."""
    # N < 1 derives K = 1, so that validate names search.n_paths, not the keys derived from it
    k = max(1, round(math.sqrt(max(n_paths, 1))))
    checks = check_values(check_at) if check_at is not None else [None]
    if policy != "topk" or len(checks) == 1:
        return k
    return [min(n_paths, k * 2 ** (len(checks) - 1 - i)) for i in range(len(checks))]


def derived_retention(n_paths: int) -> list[int]:
    """evaluate.retention's default: K/2, K, 2K for K = round(sqrt(N)), within 1..N."""
    k = derived_keep(n_paths)
    return sorted({max(1, k // 2), k, min(n_paths, 2 * k)})


def derived_n_points(n_paths: int) -> list[int]:
    """evaluate.n_points's default: K = round(sqrt(N)), N // 2 and N, within 1..N."""
    return sorted({derived_keep(n_paths), max(1, n_paths // 2), n_paths})



def warmup_paths(value: float, n_paths: int) -> int:
    """DeepConf's warm-up paths per prompt: a count, or below 1 a share of n_paths (rounded,
    and at least one path, so that a share works at any N >= 2)."""
    if value >= 1:
        return int(value)
    return max(1, int(round(value * n_paths))) if value > 0 else 0


def checkpoint_tokens(value: float, max_new_tokens: int) -> int:
    """A checkpoint as a prefix length in tokens (values below 1 are fractions)."""
    return int(round(value * max_new_tokens)) if value < 1 else int(value)


def checkpoints_of(checkpoints, max_new_tokens: int) -> list[int]:
    """Checkpoints (fractions of max_new_tokens or token counts) in generated tokens,
    sorted and distinct."""
    return sorted({checkpoint_tokens(c, max_new_tokens) for c in checkpoints})


def is_list(value) -> bool:
    return isinstance(value, (list, tuple, ListConfig))


def check_values(value) -> list:
    """search.check_at (or policy.keep) as a list: one value, or the list given."""
    return list(value) if is_list(value) else [value]


def check_plan(search, policy) -> list[tuple[int, int]]:
    """Launch-Check-Resume's checks in order, as (prefix tokens, K kept): search.check_at
    (one prefix, or a list of them: progressive) and policy.keep (a list of one K per
    check, decreasing, under policy=topk; a single K is repeated, which validate allows
    only where K is not read: the threshold policies). `validate` has checked both."""
    s = search
    checks = check_values(s.check_at)
    keeps = check_values(policy.keep)
    keeps = keeps * len(checks) if len(keeps) == 1 else keeps
    return [(checkpoint_tokens(c, s.max_new_tokens), int(k)) for c, k in zip(checks, keeps)]


def layer_index(entry: int | str, n_layers: int) -> int:
    """A tap layer entry (an index, negative from the end, or first | mid | last) as a
    layer index in 0..n_layers-1; mid is n_layers // 2. ValueError names tap.layers."""
    if isinstance(entry, str):
        if entry not in SYMBOLIC_LAYERS:
            raise ValueError(f"tap.layers: {entry!r} is not a layer; give an index or one of "
                             f"{', '.join(SYMBOLIC_LAYERS)}")
        return {"first": 0, "mid": n_layers // 2, "last": n_layers - 1}[entry]
    if not -n_layers <= entry < n_layers:
        raise ValueError(f"tap.layers: layer {entry} is outside the model's {n_layers} layers "
                         f"(allowed {-n_layers}..{n_layers - 1}, or {', '.join(SYMBOLIC_LAYERS)})")
    return entry % n_layers


def attention_heads(entries, tap_layers, n_layers: int | None,
                    n_heads: int | None) -> list[tuple[int, int]]:
    """tap.attention_heads as distinct (layer, head) pairs, sorted: "all" is every head of
    the `tap_layers`; a list holds "layer:head" strings (layer: an index, negative from the
    end, or first | mid | last). [] when off (None). ConfigError names tap.attention_heads
    and what is allowed; layers and heads are checked (and resolved) only when `n_layers`
    and `n_heads` are known: before that, only the format."""
    entries = list(entries) if OmegaConf.is_list(entries) else entries
    if entries is None:
        return []
    if entries == "all":
        if n_layers is None or n_heads is None:
            return []
        return [(layer, h) for layer in resolve_layers(tap_layers, n_layers) for h in range(n_heads)]
    if isinstance(entries, str) or not entries:
        fail("tap.attention_heads", f"{entries!r}: give all or a non-empty list of layer:head "
                                    "(e.g. [0:1,last:0])")
    pairs = set()
    for e in entries:
        layer, _, head = str(e).partition(":")
        layer = layer.strip()
        if not head.strip().isdigit() or not (layer in SYMBOLIC_LAYERS or re.fullmatch(r"-?\d+", layer)):
            fail("tap.attention_heads", f"{e!r} is not layer:head; allowed: all, or entries like "
                                        f"0:1, -1:3, last:0 (layer: an index or {', '.join(SYMBOLIC_LAYERS)}; "
                                        "quote them in YAML, where 0:1 reads as a number)")
        if n_layers is None:
            continue
        try:
            index = layer_index(layer if layer in SYMBOLIC_LAYERS else int(layer), n_layers)
        except ValueError as err:
            fail("tap.attention_heads", f"{e!r}: {str(err).removeprefix('tap.layers: ')}")
        if n_heads is not None and not int(head) < n_heads:
            fail("tap.attention_heads", f"{e!r}: head {int(head)} is outside the model's "
                                        f"{n_heads} heads (allowed 0..{n_heads - 1})")
        pairs.add((index, int(head)))
    return sorted(pairs)


def resolve_layers(layers, n_layers: int) -> list[int]:
    """Tap layer entries as distinct layer indices, shallowest first, so the last one is
    always the deepest tapped layer (the one `hidden_norm` reads)."""
    return sorted({layer_index(e, n_layers) for e in layers})
