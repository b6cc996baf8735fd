"""A request body read as strict, bounded JSON, before any field is looked at: at most
MAX_DEPTH levels of arrays and objects (deeper nesting would exhaust the parser's stack),
no NaN or Infinity (which JSON does not have, though Python's parser takes them) and no
number too large for a double, no lone UTF-16 surrogate in a string (it encodes no
character, so no tokenizer can read it). Each is refused as `BadRequest` (HTTP 400) naming
the field that holds it, as `messages[0].content`."""
from __future__ import annotations

import json
import math
import re

MAX_DEPTH = 32  # OpenAI's bodies nest a few levels (messages -> content parts -> text)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400); `param` is the field."""
    status, code = 400, None

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


class ModelNotFound(BadRequest):
    """A request for a model this server does not serve (HTTP 404, as OpenAI's and vLLM's)."""
    status, code = 404, "model_not_found"


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error",
               code: str | None = None) -> dict:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class NonFinite:
    """A number JSON cannot hold (NaN, Infinity, or one past a double's range), as read."""

    def __init__(self, text: str):
        self.text = text


def _float(text: str):
    value = float(text)
    return value if math.isfinite(value) else NonFinite(text)


def depth_past(raw: bytes, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit` in `raw` (strings left out)."""
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub(b'""', raw)):
        depth += 1 if m[0] in b"[{" else -1
        if depth > limit:
            return True
    return False


def read_json(raw: bytes) -> dict:
    """The JSON object of a request body; BadRequest naming the field otherwise."""
    if depth_past(raw, MAX_DEPTH):
        raise BadRequest("body", f"arrays and objects nest deeper than {MAX_DEPTH} levels")
    try:
        body = json.loads(raw, parse_constant=NonFinite, parse_float=_float)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise BadRequest("body", f"not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise BadRequest("body", f"a JSON object is expected, got {type(body).__name__}")
    check_values(body, "")
    return body


def check_values(value, field: str) -> None:
    """BadRequest naming the first field under `value` that holds a number JSON cannot
    hold or a string with a lone surrogate."""
    if isinstance(value, NonFinite):
        raise BadRequest(field or "body", f"{value.text} is no finite number (JSON has no NaN or "
                                          "Infinity, and a double reaches about 1.8e308)")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(field or "body", "holds a lone UTF-16 surrogate, which encodes no "
                                              "character") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_values(key, field or "body")
            check_values(item, f"{field}.{key}" if field else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_values(item, f"{field}[{i}]")
