"""One field of a request body read as the type and range it must have, or refused as
`BadRequest` naming it: an integer, a number, a flag."""
from __future__ import annotations

import math

from stopexp.serve.bodies import BadRequest


def integer(body: dict, key: str, default, low: int, high: int, setting: str | None = None):
    """body[key], a whole number in low..high (absent or null: `default`); `setting` names
    what sets the bound."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(key, f"an integer is expected, got {value!r}")
    if not low <= value <= high:
        where = f" ({setting})" if setting else ""
        raise BadRequest(key, f"must lie in {low}..{high}{where}, got {value}")
    return value


def number(body: dict, key: str, default: float, low: float, high: float = math.inf,
           low_open: bool = False) -> float:
    """body[key], a number in [low, high] ((low, high] with `low_open`; absent or null:
    `default`)."""
    value = body.get(key)
    if value is None:
        return float(default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300 \
        and (value > low if low_open else value >= low) and value <= high  # a huge int: no float
    if not ok:
        raise BadRequest(key, f"must be a number in {'(' if low_open else '['}{low:g}, {high:g}], got {value!r}")
    return float(value)


def flag(body: dict, key: str, default: bool, within: str = "") -> bool:
    """body[key], true or false (absent or null: `default`)."""
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(within + key, f"true or false is expected, got {value!r}")
    return value
