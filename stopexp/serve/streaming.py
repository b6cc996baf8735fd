"""A streamed request's text as it is generated, where the answer is decided early: once a
request has committed to one path (every other pruned: stopexp.serve.run.RequestRun.
committed), the engine loop shows that path's tokens after each step and its text goes out
in chunks; until then the stream sends nothing, since any path's text could still be
outvoted. What goes out is always a prefix of the final answer: the text of the tokens so
far, less what could still change, held back until it can no longer change (the end that
could be the start of a stop string, an unfinished UTF-8 character, trailing spaces that a
tokenizer's clean-up may join to the next token). The answer's own events then send the
rest (stopexp.serve.responses.events with `sent`)."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger(__name__)


def safe_prefix(text: str, stops: tuple[str, ...]) -> str:
    """The part of a running path's `text` that its final text starts with whatever comes
    next: all but the last len(longest stop) - 1 characters (a stop string that completes
    later is cut from the answer), an unfinished character ('\\ufffd') and trailing spaces."""
    hold = max((len(s) for s in stops), default=1) - 1
    safe = text[:len(text) - hold] if hold else text
    return safe.rstrip("\ufffd").rstrip()


class TokenFeed:
    """The committed path's tokens, handed from the engine loop's thread (`push`) to the
    stream's coroutine (`texts`) on the event loop `loop`; `decode(ids)`: their text."""

    def __init__(self, loop: asyncio.AbstractEventLoop, decode: Callable, stops: tuple[str, ...]):
        self.loop, self.decode, self.stops = loop, decode, stops
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
            safe = safe_prefix(self.decode(tokens), self.stops)
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
