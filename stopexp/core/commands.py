"""The commands stopexp prints (the one that makes a missing artifact, repairs a damaged one,
or runs the whole pipeline), written in one place so that each runs as printed.

Two grammars meet on such a line. The shell's: every word is quoted for a POSIX shell
(`shlex.quote`; a word holding a control character, such as a newline, in bash's `$'...'`
form, so the command stays on one line). Hydra's: an override built from a value
(`override`) quotes a string value in Hydra's own grammar, so that a value holding spaces,
quotes, brackets, `=`, `,`, `$` or non-ASCII text (which Hydra's lexer refuses unquoted)
reads back as the same string. An override the command line gave is already in Hydra's
grammar (Hydra parsed it, or wrote it for a sweep's job) and is repeated as it is.
"""
from __future__ import annotations

import shlex
from typing import Iterable

# bash's $'...' escapes of the control characters that have one
_ANSI_C = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b", "\f": "\\f",
           "\v": "\\v", "\\": "\\\\", "'": "\\'"}


def shell_word(word: str) -> str:
    """`word` as one word of a POSIX shell command line, on one line."""
    if word.isprintable():
        return shlex.quote(word)
    return "$'" + "".join(_ANSI_C.get(c) or (c if c.isprintable() else
                                             f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\U{ord(c):08x}")
                          for c in word) + "'"


def command(module: str, arguments: Iterable[str] = ()) -> str:
    """`python -m <module> <arguments>`, each argument quoted for the shell."""
    return " ".join(shell_word(w) for w in ("python", "-m", module, *arguments))


def stage_command(stage: str, overrides: Iterable[str] | None = None) -> str:
    """The command line of stage `stage` (`python -m stopexp.<stage>`) with `overrides`
    (Hydra override lines, as the command line gave them)."""
    return command(f"stopexp.{stage}", overrides or ())


def make_with(stage: str, overrides: Iterable[str] | None = None, it: str = "it") -> str:
    """What makes a missing artifact: the command of the `stage` that makes it and, for
    when what that stage reads is missing too, the pipeline's, which makes every artifact
    the config needs (both with the same `overrides`); `it`: what is made, as a pronoun."""
    overrides = list(overrides or ())
    return (f"make {it} with: {stage_command(stage, overrides)} (or {stage_command('pipeline', overrides)}, "
            "which makes what it needs too)")


def override(key: str, value) -> str:
    """`key=value` in Hydra's override grammar: strings quoted (Hydra's QuotedString, which
    escapes quotes and the backslashes before them; `${` escaped, so it is no
    interpolation), lists and dicts element by element (a dict's keys as
    they are: config keys), None as null."""
    return f"{key}={hydra_value(value)}"


def hydra_value(value) -> str:
    """A value in Hydra's override grammar (see `override`)."""
    from hydra.core.override_parser.types import Quote, QuotedString

    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(hydra_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    return QuotedString(text=str(value).replace("${", "\\${"), quote=Quote.double).with_quotes()
