"""Which methods evaluate runs, and what the stage says about them; the scorers themselves
are built by the stage (stopexp/stages/scorers.py)."""
from __future__ import annotations

import logging

from stopexp.config import ALWAYS_METHODS as ALWAYS
from stopexp.core.names import method_name, predictor_names

log = logging.getLogger(__name__)


def method_names(methods: list[str], predictor: str) -> list[str]:
    """The methods to evaluate, in order: the always-run ones (ALWAYS_METHODS: no_prune,
    random, confidence, oracle) missing from `methods` (evaluate.methods) first, then
    `methods` with `learned` as the configured predictor's name (`predictor`:
    predictor.name), no duplicates. So evaluate.methods=[] runs exactly the four always-run
    methods."""
    names = [method_name(m, predictor) for m in methods]
    added = [m for m in ALWAYS if m not in names]
    if added:  # the contract of metrics.json: these four are always among the methods
        log.info("evaluate.methods: %s run too (%s always run)", ", ".join(added), ", ".join(ALWAYS))
    return list(dict.fromkeys([*added, *names]))


def warn_off_checkpoint(names: list[str], plan: list[tuple[int, int]], trained: int,
                        positions: str) -> str | None:
    """One log line (returned) when a learned method trained at `trained` tokens
    (train.checkpoint) alone scores paths at a check of another prefix (a later progressive
    check, say): there it reads features from outside its training distribution.
    `positions`: train.positions (all: trained at every stored position, no warning)."""
    learned = [m for m in names if m in predictor_names()]
    other = [t for t, _ in plan if t != trained]
    if not learned or not other or positions == "all":
        return None
    message = (f"{', '.join(learned)} trained at {trained} tokens (train.checkpoint) score the "
               f"check(s) at {other} tokens too, outside their training distribution; "
               "train.positions=all trains them at every stored position")
    log.warning(message)
    return message

