"""JSON from the user's files (task files, answers-only banks). `json.loads` turns a bare
integer of more than Python's int conversion limit (`sys.get_int_max_str_digits()`, 4300
digits by default) into an uncaught ValueError; here such an integer is kept as its digits
(`LongInt`, a str). A long number is a legitimate answer, and answers are read as text
(`stopexp.metrics.answers` reads numbers of any length up to its MAX_DIGITS); a field that
must be a count refuses it as it refuses any non-integer."""
from __future__ import annotations

import json
import sys


class LongInt(str):
    """An integer literal too long for int(), as written; its repr says what it is, so a
    message that quotes it stays one short line."""

    def __repr__(self) -> str:
        return f"a {len(self.lstrip('-'))}-digit integer"


def _parse_int(text: str) -> int | LongInt:
    limit = sys.get_int_max_str_digits()  # 0: no limit
    return LongInt(text) if limit and len(text.lstrip("-")) > limit else int(text)


DECODER = json.JSONDecoder(parse_int=_parse_int)


def loads(text: str):
    """`json.loads(text)`, with integers past the conversion limit kept as `LongInt`."""
    return DECODER.decode(text)
