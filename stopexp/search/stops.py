"""What ends a path: any of the model's EOS ids (`eos_ids`), or a stop sequence: a path ends
once its decoded text contains one of the stop strings.

Semantics are those of HF `generate(stop_strings=...)`: the path ends at the first token
whose text completes a stop string, and that whole token is kept (it may carry characters
past the stop string's end); nothing after it is generated, counted or kept, so a path's
text is always the decoding of its kept tokens. Only generated text is searched, never the
prompt (HF also matches a stop string that starts inside the prompt; vLLM does not), and it is
the text with control special tokens skipped (HF matches their strings, e.g. "<s>", instead);
a special token that a stop string or a thinking tag holds stays (stopexp.core.token_text).

The check is incremental: each step decodes only the tail of each live path, long enough
that a stop string ending in the newest token (one that spans token boundaries included)
lies inside it. A string found anywhere in that tail must end in the newest token, since
the path would have ended earlier otherwise. Tokens that decode to nothing (special tokens,
skipped as in the path's text) do not count towards the tail's length, so a stop split by
any number of them is still found.
"""
from __future__ import annotations

from stopexp.core.token_text import text_of, texts_of


class StopStrings:
    """Stop strings and the tokenizer that turns token ids back into text."""

    def __init__(self, stops, tokenizer):
        self.stops = tuple(stops)
        if not self.stops:
            raise ValueError("search.stop: StopStrings needs at least one stop string")
        empty = [i for i, s in enumerate(self.stops) if not isinstance(s, str) or not s]
        if empty:
            raise ValueError(f"search.stop: entry {empty[0]} is empty (or not a string); "
                             "every stop must be a non-empty string")
        if tokenizer is None:
            raise ValueError("search.stop needs the tokenizer to decode paths (pass tokenizer=)")
        self.tokenizer = tokenizer
        # every token that decodes to something adds at least one byte, so a stop of n bytes
        # spans at most n of them; two more keep a token boundary (and any leading-space
        # rule) in front of it
        self.window = max(len(s.encode()) for s in self.stops) + 2
        self._blank: dict[int, bool] = {}  # token id -> decodes to nothing

    def is_blank(self, token: int) -> bool:
        """Whether the token decodes to nothing (it adds nothing to a stop)."""
        if token not in self._blank:
            self._blank[token] = not text_of(self.tokenizer, [token], keep=self.stops)
        return self._blank[token]

    def trim(self, tokens: list[int]) -> list[int]:
        """The shortest suffix of `tokens` that holds `window` tokens decoding to something
        (all of them when there are fewer): what a stop ending in the last one lies in."""
        seen = 0
        for start in range(len(tokens) - 1, -1, -1):
            seen += not self.is_blank(tokens[start])
            if seen == self.window:
                return tokens[start:]
        return tokens

    def hits(self, tails: list[list[int]]) -> list[bool]:
        """For each path's recent token ids (the newest last; any longer prefix is cut by
        `trim`): does its text now hold a stop?"""
        texts = texts_of(self.tokenizer, [self.trim(t) for t in tails], keep=self.stops)
        return [any(s in text for s in self.stops) for text in texts]


def eos_ids(model, tokenizer) -> tuple[int, ...]:
    """Every token id that ends a path: `generation_config.eos_token_id` (an int or a list:
    Llama 3 and Qwen 2.5 instruct models list several, and HF `generate` stops at any of
    them) plus the tokenizer's EOS. Raises ValueError when there is none."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if source is None:
            continue
        for i in ([source] if isinstance(source, int) else list(source)):
            if int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("the model's generation_config and its tokenizer name no EOS token")
    return tuple(ids)


def boundary_stop(stops: StopStrings, prefix: list[int], ids: list[int]) -> int:
    """How many of a continuation's tokens `ids` the path would keep after `prefix`, as far
    as a stop string that starts inside the prefix decides it: up to the token completing
    one (an engine request that starts after the prefix cannot see such a stop), else all."""
    seen = 0
    for k in range(1, len(ids) + 1):
        if stops.hits([prefix + ids[:k]])[0]:
            return k
        seen += not stops.is_blank(ids[k - 1])
        if seen >= stops.window:  # a stop spans fewer tokens that decode to something
            break
    return len(ids)


def split_stop(text: str, stops) -> tuple[str, str]:
    """`text` cut at its first stop string: (the text before it, the stop string; "" where
    none occurs). A path's last token may carry characters past its stop (see above); they
    are dropped with it, as vLLM drops them."""
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        return text, ""
    at, stop = min(found, key=lambda f: (f[0], -len(f[1])))
    return text[:at], stop
