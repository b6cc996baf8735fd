"""What a schema field declares about its numbers, as dataclass field metadata, so that one
checker enforces it over every key of every schema (stopexp.config.limits), the stopping
methods' settings included:

    window: int = field(default=8, metadata=count(bound="n_paths"))
    warmup: float = field(default=0.25, metadata=count(bound="n_paths", share=True))

An int-typed field is a whole number by its type; `count` makes a field of another type
(a float or Any that holds counts) one, or with `share` a count at 1 and above and a share
of its bound below 1. `bound` names what the value may not exceed (BOUNDS), `below` that
it must stay under it."""
from __future__ import annotations

# what a count may not exceed: the paths of a prompt, the tokens of a path, the LM's
# vocabulary, the width of its hidden state and its positions (engine.max_model_len under
# vLLM), the trace bank's train prompts and the prompts of the evaluated split
BOUNDS = ("n_paths", "max_new_tokens", "vocab", "width", "positions", "train_prompts",
          "split_prompts")


def count(bound: str | None = None, share: bool = False, below: bool = False) -> dict:
    """Field metadata: whole numbers (below 1, with `share`, a share of `bound`), at most
    `bound` (one of BOUNDS; with `below`, less than it) where it is known."""
    if bound is not None and bound not in BOUNDS:
        raise ValueError(f"bound {bound!r} is none of {BOUNDS}")
    return {"count": "share" if share else "whole", "bound": bound, "below": below}
