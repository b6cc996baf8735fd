"""The search group (conf/search/): how paths are sampled and checked (Launch-Check-Resume
or beam search), one schema each (`SearchConfig`, the view, holds both's keys:
stopexp.config.options), and its checks. Where a check sits relative to the tap's ones, see
stopexp.config.validation."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from stopexp.config.options import Group
from stopexp.config.ranges import at_least, fail, within
from stopexp.core.limits import count
from stopexp.core.protocol import checkpoint_tokens

# The smallest sampling temperature. Logits are divided by it in float32: at 1e-38 a logit
# of 10 overflows to inf and the log-probs turn NaN. At 1e-4 a logit of 1e4 stays far
# inside float32, and a logit gap of 1e-3 is already 10 nats, i.e. sampling is greedy
# for all purposes: below it, use search.do_sample=false.
MIN_TEMPERATURE = 1e-4


@dataclass
class ParallelSearchConfig:
    """parallel: Launch-Check-Resume (and what beam search reads too)."""
    name: str = "parallel"      # parallel (Launch-Check-Resume) | beam
    n_paths: int = 64           # N paths launched per prompt (parallel)
    beam_width: int = 4         # search=beam, and evaluate.compare_beam's plain beam search
    # the prefix where Launch-Check-Resume checks (a position the features hold: one of
    # tap.checkpoints or a multiple of tap.positions.stride), or a list of them
    # (progressive: policy=topk then takes one decreasing K per check in policy.keep)
    check_at: Any = field(default=0.08, metadata=count("max_new_tokens", share=True, below=True))
    score_rule: str = "last"    # several checks: last | running_mean (STEP, arXiv 2601.09093)
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = field(default=0, metadata=count("vocab"))
    do_sample: bool = True
    conf_topk: int = field(default=5, metadata=count("vocab"))
    # DeepConf group-confidence window (tokens)
    group_window: int = field(default=8, metadata=count("max_new_tokens"))
    max_batch_rows: int = 1024  # rows per forward; larger prompt sets run in chunks
    # stop strings: a path ends at the token that completes one (kept, as in HF
    # generate(stop_strings=...)); nothing after it is generated or counted
    stop: List[str] = field(default_factory=list)


@dataclass
class BeamSearchConfig(ParallelSearchConfig):
    """beam: beam search pruned by the checks."""
    name: str = "beam"
    patience: int = 2           # consecutive marks before a beam is pruned
    # prefixes checked (like tap.checkpoints); None = every step
    beam_checks: Optional[List[float]] = field(
        default=None, metadata=count("max_new_tokens", share=True, below=True))
    refill: bool = True         # a pruned beam's slot goes to the next best candidate; false = the beam narrows

    @staticmethod
    def needs(s) -> None:
        if s.beam_checks is not None and not len(s.beam_checks):
            fail("search.beam_checks", "[]: give the prefixes where beams are checked, or null "
                                       "for every step")


@dataclass
class SearchConfig(BeamSearchConfig):
    """Both searches' keys (the view: what cfg.search holds)."""
    name: str = "parallel"


SEARCH = Group("search", {"parallel": ParallelSearchConfig, "beam": BeamSearchConfig}, SearchConfig)


def check_lengths(s) -> None:
    """search.max_new_tokens and search.stop."""
    at_least("search.max_new_tokens", s.max_new_tokens, 2)
    if any(not x for x in s.stop):
        fail("search.stop", "every stop string must be non-empty")


def check_sampling(s) -> None:
    """The sampling knobs, N and the batch sizes."""
    if not s.temperature >= MIN_TEMPERATURE:
        fail("search.temperature", f"must be >= {MIN_TEMPERATURE}, got {s.temperature} (smaller "
                                   "temperatures overflow float32 logits; use "
                                   "search.do_sample=false for greedy)")
    within("search.top_p", s.top_p, 0, 1, low_open=True)
    at_least("search.top_k", s.top_k, 0)
    if not s.n_paths >= 1:
        fail("search.n_paths", f"N must be >= 1, got {s.n_paths}")
    for name in ("beam_width", "patience", "conf_topk", "group_window", "max_batch_rows"):
        at_least(f"search.{name}", s[name], 1)


def check_beam(s) -> None:
    """search.beam_checks: prefixes within search.max_new_tokens, and what search=beam needs."""
    SEARCH.check(s)
    for c in s.beam_checks or []:
        t = checkpoint_tokens(c, s.max_new_tokens) if c > 0 else 0
        if not 1 <= t < s.max_new_tokens or (c >= 1 and c != int(c)):
            fail("search.beam_checks", f"{c} is not a prefix in 1..{s.max_new_tokens - 1} "
                                       "tokens (or a fraction of search.max_new_tokens)")
