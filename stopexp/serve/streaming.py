"""A streamed request's text as it is generated, where the answer is decided early: once a
request of one choice (one prompt, `n` 1) has committed to one path (every other pruned:
stopexp.serve.run.RequestRun.committed), the engine loop shows that path's tokens after
each step and its text goes out in chunks; until then the stream sends nothing, since any
path's text could still be outvoted. What goes out is always a prefix of the final answer:
the text of the tokens so far, less what could still change, held back until it can no
longer change (as vLLM's detokenizer holds it back: the end that could be the start of a
stop string, which the answer leaves out; an unfinished UTF-8 character; trailing spaces
that a tokenizer's clean-up may join to the next token). The answer's own events then send
the rest (stopexp.serve.responses.events with `sent`).

A request whose choices are known only at the vote (`n` > 1), or whose choice carries more
than its text (log-probs, the echoed prompt), streams its choices once the vote is decided."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from stopexp.search.stops import split_stop

log = logging.getLogger(__name__)


def streams_as_generated(gen) -> bool:
    """Whether the streamed request `gen` (stopexp.serve.requests.Generation) sends its
    committed path's text as it is generated."""
    return gen.stream and gen.choices == 1 and gen.batch == 1 and gen.logprobs is None and not gen.echo


def safe_prefix(text: str, stops: tuple[str, ...], include_stop: bool = False) -> str:
    """The part of a running path's `text` that its final text starts with whatever comes
    next: the text before a stop string it holds (with the stop string where the output
    keeps it), else all but the longest end that is the start of a stop string (one that
    completes later is left out of the answer; nothing is held where the output keeps stop
    strings), less an unfinished character ('\\ufffd') and trailing spaces."""
    before, stop = split_stop(text, stops)
    if stop:
        return before + stop if include_stop else before
    if not include_stop:
        starts = [k for k in range(max(0, len(text) - max(map(len, stops), default=0) + 1), len(text))
                  if any(s.startswith(text[k:]) for s in stops)]
        text = text[:starts[0]] if starts else text
    return text.rstrip("\ufffd").rstrip()


class TokenFeed:
    """The committed path's tokens of request `gen`, handed from the engine loop's thread
    (`push`) to the stream's coroutine (`next_text`) on the event loop `loop`;
    `decode(ids)`: their text."""

    def __init__(self, loop: asyncio.AbstractEventLoop, decode: Callable, gen):
        self.loop, self.decode = loop, decode
        self.stops, self.include_stop = gen.params.stop, gen.include_stop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.key = None
        self.sent = ""

    def push(self, key, tokens: list[int]) -> None:
        """In the engine loop's thread, after a step."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (key, tokens))

    async def next_text(self, answered: asyncio.Future) -> str | None:
        """The next new text to send, or None once the request is answered."""
        while True:
            if self.queue.empty() and answered.done():
                return None
            getter = asyncio.ensure_future(self.queue.get())
            try:
                await asyncio.wait({getter, answered}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                got = getter.done()
                if not got:
                    getter.cancel()
            if not got:
                continue
            key, tokens = getter.result()
            while not self.queue.empty():  # only the newest tokens matter
                key, tokens = self.queue.get_nowait()
            if self.key is None:
                self.key = key
            if key != self.key:  # never expected: the committed path does not change
                continue
            safe = safe_prefix(self.decode(tokens), self.stops, self.include_stop)
            if len(safe) > len(self.sent) and safe.startswith(self.sent):
                new, self.sent = safe[len(self.sent):], safe
                return new

    def sent_before(self, final: str) -> str:
        """The text already sent, checked against the answer's `final` text, which starts
        with it (a tokenizer whose text of a prefix is no prefix of its text would break it:
        logged, the rest then sent from the same length on)."""
        if not final.startswith(self.sent):
            log.warning("a streamed text is no prefix of its answer: %r, then %r", self.sent, final)
        return self.sent
