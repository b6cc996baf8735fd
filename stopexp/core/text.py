r"""Config text as the user means it: the escapes a command line leaves undecoded, and the
stop strings a path ends at.

Hydra's override grammar unescapes only quotes and backslashes before quotes, so
`search.stop='["\n\nQuestion:"]'` arrives as a literal backslash-n. The text keys below
decode `\n`, `\t`, `\r` and `\\` once, where the config is read (never in place, so
reading a config twice cannot decode twice); any other backslash stays, as in `\boxed`.
"""
from __future__ import annotations

import re

TEXT_KEYS = ("stop", "prompt_template", "instruction")  # of the task; search.stop too
# sacrebleu's tokenizers that need no download (flores, spm) or extra package (mecab)
TEXT_TOKENIZERS = ("13a", "intl", "zh", "char")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
_ESCAPE = re.compile(r"\\([ntr\\])")


def decode_escapes(text: str) -> str:
    r"""`text` with `\n`, `\t`, `\r` and `\\` (two characters each) decoded, left to right."""
    return _ESCAPE.sub(lambda m: _ESCAPES[m[1]], text)


def decoded_text(section: dict) -> dict:
    """A plain config section with its TEXT_KEYS decoded (`decode_escapes`)."""
    out = dict(section)
    for key in TEXT_KEYS:
        if isinstance(out.get(key), str):
            out[key] = decode_escapes(out[key])
        elif out.get(key) is not None:
            out[key] = [decode_escapes(x) if isinstance(x, str) else x for x in out[key]]
    return out


def stop_strings(task, search) -> tuple[str, ...]:
    """The stop strings a path ends at: the task's own (`task.stop`, where a new example
    would start) then `search.stop`, escapes decoded, each once."""
    return tuple(dict.fromkeys(map(decode_escapes, [*task.stop, *search.stop])))
