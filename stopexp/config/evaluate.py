"""The evaluate group (conf/evaluate.yaml): which methods are compared, on what, and how a
prompt's output is chosen; and its checks (run for the evaluate and pipeline stages)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from stopexp.config import policy
from stopexp.config.ranges import TOGETHER, at_least, fail, within
from stopexp.config.stopping import TracesStopping, check_stopping
from stopexp.core.limits import count
from stopexp.core.names import (ALWAYS_METHODS, BASELINE_METHODS, ORACLE_METHODS, SPLITS, external,
                                method_name, names as registered, predictor_names)


@dataclass
class EvaluateConfig:
    mode: str = "replay"    # replay (from the trace bank) | online (runs the LM)
    split: str = "test"
    # what runs, plus no_prune, random, confidence and oracle, which always do (ALWAYS_METHODS:
    # [] runs just those four); `learned` = the configured predictor (predictor.name)
    methods: List[str] = field(default_factory=lambda: [
        "no_prune", "random", "confidence", "min_logprob", "entropy", "deepconf", "hidden_norm",
        "hidden_mean", "hidden_var", "st_bon", "conf_features", "learned", "oracle", "esc", "adaptive_consistency",
        "deepconf_online", "deepconf_weighted", "deepconf_top"])
    # the Pareto points: every K of `retention` at N = search.n_paths, no_prune at every N
    # of `n_points`; derived from search.n_paths (derived_retention, derived_n_points)
    retention: List[int] = "${stopexp_retention:${search.n_paths}}"  # type: ignore[assignment]
    n_points: List[int] = "${stopexp_n_points:${search.n_paths}}"  # type: ignore[assignment]
    bootstrap: int = 1000
    text_metrics: bool = True
    # the final output of a prompt: vote (majority over the kept paths' answers), or for
    # tasks without a single answer the kept path with the best signal (the method's score
    # at the check), the best LM score (mean token log-prob) or, as an oracle, the best reward
    select: str = "vote"            # vote | signal | lm_score | oracle
    compare_beam: bool = False      # also run plain beam search (no pruning) and compare outputs
    # search=beam (which runs the LM online): the first N prompts of the split; None: all
    max_prompts: Optional[int] = field(default=None, metadata=count("split_prompts"))
    bertscore_model: Optional[str] = None  # None = the offline MiniLM encoder
    seed: int = 0
    # the settings of the stopping methods of `methods`, one subtree per method with settings
    # (evaluate.stopping.esc.window, ...): each method's own dataclass (stopexp.config.stopping)
    stopping: TracesStopping = field(default_factory=TracesStopping)
    vote: str = "majority"          # majority | weighted (by the final signal) | filtered (stopexp.core.voting)
    vote_top: float = 0.5           # filtered: share of the scored kept paths that vote
    # the predictors scored are those `python -m stopexp.train <these overrides>` trains
    # (another bank's: its predictor, loss and train sections replace this config's), scored
    # on this config's bank; None: this config's own (stopexp.stages.trained_with)
    trained_with: Optional[str] = None


def check_method_names(names) -> None:
    """Every name in evaluate.methods is a built-in method, a predictor, `learned`, or a
    scorer registered with stopexp.signals.methods.register_external, or a registered stopping
    method (their registry: stopexp.core.names); ConfigError otherwise."""
    builtin = {*ALWAYS_METHODS, *BASELINE_METHODS, *ORACLE_METHODS, *registered("stopping"),
               *predictor_names(), "learned"}
    for name in names:
        if name not in builtin and external(name) is None:
            fail("evaluate.methods", f"{name!r} unknown; allowed: {', '.join(sorted(builtin))} or "
                                     "a scorer registered with stopexp.signals.methods.register_external")


def check_evaluate(cfg) -> None:
    """evaluate.* (and the policy knobs evaluate reads), for the evaluate and pipeline stages."""
    ev, s, pol = cfg.evaluate, cfg.search, cfg.policy
    check_method_names(ev.methods)
    bert = ev.bertscore_model
    if (ev.text_metrics or ev.compare_beam) and bert and bert.startswith(("/", ".", "~")) and not Path(bert).expanduser().is_dir():
        fail("evaluate.bertscore_model", f"{bert!r} is no model directory; give a local "
                                         "directory, a hub id, or leave it unset for the bundled MiniLM")
    if ev.split not in SPLITS:
        fail("evaluate.split", f"{ev.split!r} unknown; allowed: {', '.join(SPLITS)}")
    if not cfg.collect.prompts.get(ev.split, 0) > 0:
        fail("evaluate.split", f"the trace bank holds no {ev.split!r} prompts "
                               f"(collect.prompts.{ev.split}={cfg.collect.prompts.get(ev.split, 0)})")
    at_least("evaluate.bootstrap", ev.bootstrap, 1)
    if ev.max_prompts is not None:
        at_least("evaluate.max_prompts", ev.max_prompts, 1)
    policy.check_keep_within(pol, s.n_paths)
    within("evaluate.vote_top", ev.vote_top, 0, 1, low_open=True)
    if ev.vote_top != EvaluateConfig.vote_top and ev.vote != "filtered":
        fail("evaluate.vote_top", f"{ev.vote_top}: only evaluate.vote=filtered reads it, not "
                                  f"vote={ev.vote}")
    if ev.select != "vote" and ev.vote != "majority":
        fail("evaluate.vote", f"{ev.vote!r} is not used: evaluate.select={ev.select} selects one "
                              "path instead of voting; set evaluate.select=vote, or leave "
                              "evaluate.vote majority")
    for key, values in (("evaluate.retention", ev.retention), ("evaluate.n_points", ev.n_points)):
        if not len(values):  # an empty Pareto sweep: the table and plot would have no point
            fail(key, "[] gives no Pareto point; give at least one, or leave it unset "
                      "(derived from search.n_paths)")
    for k in ev.retention:
        if not 1 <= k <= s.n_paths:
            fail("evaluate.retention", f"K={k} must lie in 1..N={s.n_paths} (search.n_paths)"
                                       f"{TOGETHER.format(key='evaluate.retention')}")
    for n in ev.n_points:
        if not 1 <= n <= s.n_paths:
            fail("evaluate.n_points", f"N={n} must lie in 1..{s.n_paths} (search.n_paths)"
                                      f"{TOGETHER.format(key='evaluate.n_points')}")
    check_stopping(ev.stopping, "evaluate.stopping", "traces", ev.methods, s.n_paths)
    if ev.trained_with is not None:
        check_trained_with(ev.trained_with, cfg.stage)
    if "combined" in ev.methods:
        check_combined(ev, cfg.predictor.name)
    if "step" in ev.methods:
        check_step(cfg)


def trained_with_overrides(text: str) -> list[str]:
    """evaluate.trained_with as the train command line's overrides (shell words: a value with
    spaces is quoted inside it); ConfigError naming the key where it cannot be split."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        fail("evaluate.trained_with", f"{text!r} cannot be split into overrides ({e}); give the "
                                      "train command's overrides, e.g. \"+exp=toy_contrastive seed=1\"")
    if not words:
        fail("evaluate.trained_with", "empty; give the train command's overrides, or leave it "
                                      "unset to score this config's own predictors")
    return words


def check_trained_with(text: str, stage: str) -> None:
    """The overrides split; the pipeline trains its own config's predictors only."""
    trained_with_overrides(text)
    if stage == "pipeline":
        fail("evaluate.trained_with", "the pipeline trains and scores this config's own predictors; "
                                      "train the other config with python -m stopexp.train, then "
                                      "score it here with python -m stopexp.evaluate")


def check_step(cfg) -> None:
    """STEP has its budget (engine.kv_budget) and a scoring method that runs as its step
    score, reads the states at step boundaries (tap.positions.step_ends, or every position),
    and online runs on
    vLLM's in-engine taps (the hf engine records states at fixed checks only)."""
    ev = cfg.evaluate
    if cfg.engine.kv_budget is None:
        fail("engine.kv_budget", "step prunes when a prompt's running paths hold more KV than "
                                 "the budget: give KV blocks (e.g. engine.kv_budget=40) or a share "
                                 "(e.g. engine.kv_budget=0.5)")
    _check_signal("evaluate.stopping.step.signal", ev.stopping.step.signal, ev, cfg.predictor.name)
    if cfg.predictor.centre_prompts and \
            method_name(ev.stopping.step.signal, cfg.predictor.name) == cfg.predictor.name:
        fail("predictor.centre_prompts", "step scores each path at its own step boundaries, not a "
                                         "prompt's live paths together at one position, so there is "
                                         "no mean of its siblings to centre on; leave it false, or "
                                         "give step another signal (evaluate.stopping.step.signal)")
    if not (cfg.tap.positions.step_ends or cfg.tap.positions.stride == 1):
        fail("tap.positions.step_ends", "step scores the states at step boundaries: set "
                                        "tap.positions.step_ends=true (or tap.positions.stride=1) "
                                        "and featurize")
    if ev.mode == "online" and not (cfg.engine.name == "vllm" and cfg.engine.taps
                                    and not cfg.tap.get("attention_heads")):
        fail("evaluate.methods", "step online reads the states at step boundaries inside vLLM "
                                 "while it generates: run it with engine=vllm (engine.taps=true, "
                                 "no tap.attention_heads), or with evaluate.mode=replay")


def _check_signal(key: str, signal: str, ev, predictor_name: str) -> None:
    """`signal` (at `key`) is a scoring method that runs (`learned`: the configured
    predictor, also by its name)."""
    scoring = {method_name(m, predictor_name) for m in (*ALWAYS_METHODS, *ev.methods)} - {
        "no_prune", *registered("stopping")}
    if method_name(signal, predictor_name) not in scoring:
        fail(key, f"{signal!r} is not a scoring method that runs; allowed: "
                  f"{', '.join(sorted(scoring))} (add it to evaluate.methods)")


def check_combined(ev, predictor_name: str) -> None:
    """evaluate.stopping.combined.signal is a scoring method that runs (`learned`: the
    configured predictor, also by its name), and the bank's features are read (replay)."""
    _check_signal("evaluate.stopping.combined.signal", ev.stopping.combined.signal, ev, predictor_name)
    if ev.mode != "replay":
        fail("evaluate.methods", "combined reads every check's scores from the bank's features: "
                                 "run it with evaluate.mode=replay")
