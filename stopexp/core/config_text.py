r"""Config text as the user means it: the escapes a command line leaves undecoded, and the
stop strings a path ends at.

Hydra's override grammar unescapes only quotes and backslashes before quotes, so
`search.stop='["\n\nQuestion:"]'` arrives as a literal backslash-n. The text keys
(`TEXT_KEYS` of the task, `search.stop`, `model.thinking.end_tag` and `step_separator`)
decode `\n`, `\t` and `\r` once, where the config is read (never in place, so reading a
config twice cannot decode twice), except where they start a LaTeX command: the letters
after a backslash are one command name, and `\neq`, `\nabla`, `\theta`, `\text{}`,
`\times`, `\right)`, `\rangle` ... (`LATEX_COMMANDS`) stay as written, while
`\nQuestion` and `\n\n` are newlines. `\\` before `n`, `t` or `r` is one backslash
(`\\nu` is the text `\nu` even if it were no command); every other backslash stays,
as in `\boxed` and LaTeX's line break `\\`.
"""
from __future__ import annotations

import re

TEXT_KEYS = ("stop", "prompt_template", "instruction")  # of the task; search.stop too
# sacrebleu's tokenizers that need no download (flores, spm) or extra package (mecab)
TEXT_TOKENIZERS = ("13a", "intl", "zh", "char")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}
# LaTeX (and amsmath / amssymb) commands whose names start with an escape's letter: a
# prompt or stop that holds one keeps it as written
LATEX_COMMANDS = frozenset("""
nabla natural ne nearrow neg negmedspace negthickspace negthinspace neq newcommand newline
nexists ngeq ngeqslant ngtr ni nleftarrow nLeftarrow nleftrightarrow nLeftrightarrow nleq
nleqslant nless nmid noindent nolimits nonumber normalfont normalsize not notin nparallel
nprec nrightarrow nRightarrow nsim nsubseteq nsucc nsupseteq ntriangleleft ntriangleright
nu nvdash nvDash nVdash nwarrow
tag tan tanh tau tbinom text textbf textcolor textit textnormal textrm textsc textsf
textstyle texttt textup tfrac therefore theta thickapprox thicksim thinspace tilde times
tiny to top triangle triangledown triangleleft trianglelefteq triangleq triangleright
trianglerighteq tt twoheadleftarrow twoheadrightarrow
raisebox rangle rbrace rbrack rceil ref renewcommand rfloor rgroup rho right rightarrow
rightharpoondown rightharpoonup rightleftarrows rightleftharpoons rightrightarrows
rightsquigarrow rightthreetimes risingdotseq rm rmfamily rmoustache rtimes rule rvert rVert
""".split())
# an escaped backslash before an escape letter, or an escape letter and the command it starts
_ESCAPE = re.compile(r"\\\\(?=[ntr])|\\([ntr])([a-zA-Z]*)")


def _decode(m: re.Match) -> str:
    if m[1] is None:  # \\n: a backslash, then the letter as written
        return "\\"
    if m[1] + m[2] in LATEX_COMMANDS:
        return m[0]
    return _ESCAPES[m[1]] + m[2]


def decode_escapes(text: str) -> str:
    r"""`text` with `\n`, `\t`, `\r` (two characters each) decoded where they start no LaTeX
    command (`LATEX_COMMANDS`), and `\\` before `n`, `t`, `r` as one backslash, left to
    right (see the module doc)."""
    return _ESCAPE.sub(_decode, text)


def decoded_text(section: dict) -> dict:
    """A plain config section with its TEXT_KEYS decoded (`decode_escapes`)."""
    out = dict(section)
    for key in TEXT_KEYS:
        if isinstance(out.get(key), str):
            out[key] = decode_escapes(out[key])
        elif out.get(key) is not None:
            out[key] = [decode_escapes(x) if isinstance(x, str) else x for x in out[key]]
    return out


def has_answer(answer) -> bool:
    """Whether a voter's answer counts: None, "" and whitespace are no answer (they never vote)."""
    return answer is not None and not (isinstance(answer, str) and not answer.strip())


def stop_strings(task, search) -> tuple[str, ...]:
    """The stop strings a path ends at: the task's own (`task.stop`, where a new example
    would start; a mixture's and each of its components'), then `search.stop`, escapes
    decoded, each once."""
    own = [*task.stop, *(s for c in task.get("components") or [] for s in c["task"].get("stop") or [])]
    return tuple(dict.fromkeys(map(decode_escapes, [*own, *search.stop])))
