"""A path's text from its token ids, as every engine and every reader of a path decodes it.

Decoding with `skip_special_tokens=True` drops every special token, and a thinking model's
tags may be special tokens (`</think>` is one in some tokenizers): the answer after them
would then be lost, and the whole path counted as thinking. So a path's text leaves out the
special tokens that are control (BOS, EOS, padding, chat turns) and keeps those whose
text the parsing reads: the thinking tags (`THINKING_TAGS`, and a configured end tag that
`keep_in_text` registers on the tokenizer) and whatever a caller passes as `keep` (the stop
strings a stop check looks for).
"""
from __future__ import annotations

import weakref

THINKING_TAGS = ("<think>", "</think>")
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer -> its kept texts
_SKIPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {key: ids}


def keep_in_text(tokenizer, texts) -> None:
    """Let the special tokens whose text lies in one of `texts` (a configured thinking end
    tag) survive in every text of `tokenizer` from now on."""
    _KEPT[tokenizer] = tuple(dict.fromkeys([*_KEPT.get(tokenizer, ()), *(t for t in texts if t)]))


def special_texts(tokenizer) -> dict[int, str]:
    """Every special token of `tokenizer`, id -> text: the named ones (BOS, EOS, ...) and
    the added tokens marked special (which `skip_special_tokens` drops too); none for a
    tokenizer that declares none (a plain decoder)."""
    out = {i: tokenizer.convert_ids_to_tokens(i) for i in getattr(tokenizer, "all_special_ids", ())}
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    out.update({i: t.content for i, t in added.items() if getattr(t, "special", False)})
    return out


def skipped_ids(tokenizer, keep=()) -> frozenset[int]:
    """The special tokens a text of `tokenizer` leaves out: all but those whose text lies in
    a thinking tag, a text `keep_in_text` registered, or one of `keep`."""
    needed = (*THINKING_TAGS, *_KEPT.get(tokenizer, ()), *keep)
    key = (len(tokenizer) if hasattr(tokenizer, "__len__") else 0, needed)  # grows with added tokens
    cache = _SKIPPED.setdefault(tokenizer, {})
    if key not in cache:
        cache[key] = frozenset(i for i, text in special_texts(tokenizer).items()
                               if not (text and any(text in s for s in needed)))
    return cache[key]


def text_of(tokenizer, ids, keep=()) -> str:
    """The text of token ids `ids`: control special tokens left out (`skipped_ids`)."""
    skip = skipped_ids(tokenizer, keep)
    return tokenizer.decode([i for i in ids if i not in skip], skip_special_tokens=False)


def texts_of(tokenizer, rows, keep=()) -> list[str]:
    """`text_of` of each list of token ids in `rows`, in one call."""
    skip = skipped_ids(tokenizer, keep)
    return tokenizer.batch_decode([[i for i in ids if i not in skip] for ids in rows],
                                  skip_special_tokens=False)


def stop_token_ids(tokenizer, stops) -> tuple[int, ...]:
    """The special tokens that are by themselves one of the stop strings `stops`: an engine
    that matches stops on text with special tokens skipped (vLLM) must stop at these ids."""
    return tuple(i for i, text in special_texts(tokenizer).items() if text and text in stops)
