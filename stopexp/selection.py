"""Selection instead of voting, for tasks without a single answer (data-to-text): a
prompt's final output is one of the paths that run to the end (the kept paths and those
that ended before the check), chosen by `evaluate.select`:

    vote      majority vote over the answers (the default; stopexp.accounting.outcome)
    signal    the kept path with the best score of the method at the check; a method with
              no score of its own (no_prune), or a prompt whose every path ended before the
              check, falls back to lm_score
    lm_score  the path with the best LM score: the mean log-prob of its generated tokens
              (the bank's token_logprob)
    oracle    the path with the best true reward (stopexp/rewards.py): an upper bound

Ties go to the lowest path id. Besides the choice this module adds what selection is
judged by: the paths' rewards and LM scores read from the bank (online runs reproduce the
bank's paths, checked text by text), the within-prompt rank correlations of a method's
scores with a continuous reward, and the comparison of every chosen output with plain
beam search's (stopexp.evaluate_beam, pruning off, the same prompts).
"""
from __future__ import annotations

import logging

import numpy as np

from stopexp.errors import ConfigError

log = logging.getLogger(__name__)

SELECT_MODES = ("vote", "signal", "lm_score", "oracle")


def lm_scores(token_logprobs) -> np.ndarray:
    """(P,) mean log-prob of each path's generated tokens (NaN for a path without any)."""
    return np.asarray([float(np.mean(lp)) if len(lp) else np.nan for lp in token_logprobs])


def pick(rows: np.ndarray, mode: str, kept_rows: np.ndarray, scores: np.ndarray | None,
         lm_score: np.ndarray | None, reward: np.ndarray | None) -> int:
    """The row (an index of `rows`' paths) that `mode` selects among the finishing `rows`
    of one prompt; `kept_rows` is the subset that was alive at the check and kept. NaN
    never wins unless all are NaN. ValueError when the mode's values are missing."""
    if mode == "signal" and scores is not None and len(kept_rows):
        rows, values = kept_rows, scores[kept_rows]
    elif mode in ("signal", "lm_score"):
        if lm_score is None:
            raise ConfigError(f"evaluate.select={mode}: the paths carry no LM score")
        values = lm_score[rows]
    elif mode == "oracle":
        if reward is None:
            raise ConfigError("evaluate.select=oracle: the paths carry no reward")
        values = reward[rows]
    else:
        raise ConfigError(f"evaluate.select: {mode!r} is not a selection; allowed: "
                          f"{', '.join(SELECT_MODES[1:])}")
    values = np.where(np.isnan(values), -np.inf, np.asarray(values, dtype=float))
    return int(rows[int(np.argmax(values))])  # argmax: the first of ties, rows are in path order


def attach_bank_columns(views: dict, root, split: str) -> None:
    """Online: give every method's paths their reward and LM score from the bank. The paths
    that finish are the bank's own (each path has its own random stream), which is checked:
    a finishing path whose text differs from the bank's raises ValueError naming it; paths
    pruned online (their text is a prefix) get NaN."""
    from stopexp import bank

    ds = bank.load_bank(root, split)
    index = {(int(p), int(j)): i for i, (p, j) in enumerate(zip(ds["prompt_id"][:], ds["path_id"][:]))}
    texts, rewards = ds["text"][:], bank.rewards_of(ds).astype(float)  # as replay_paths
    scores = lm_scores(ds["token_logprob"][:])
    for name, (paths, decision) in views.items():
        ids = paths.prompt_ids[paths.group]
        rows = np.asarray([index[(int(p), int(j))] for p, j in zip(ids, paths.path_id)])
        # no_prune (no decision): every path finishes
        finishing = ~paths.alive | (True if decision is None else np.asarray(decision.kept, bool))
        differ = finishing & (np.asarray(texts)[rows] != paths.text)
        if differ.any():
            i = int(np.nonzero(differ)[0][0])
            raise ValueError(f"{name}: online path {paths.path_id[i]} of prompt {ids[i]} differs "
                             "from the bank's, so the bank's reward is not its reward")
        paths.reward = np.where(finishing, rewards[rows], np.nan)
        paths.lm_score = np.where(finishing, scores[rows], np.nan)


def compare_with_beam(cfg, prompt_ids: np.ndarray, chosen: dict, results: dict) -> dict:
    """Run plain beam search (search=beam, no pruning: stopexp.evaluate_beam's no_prune) on
    the evaluated prompts and add to every method's results `text_vs_beam` (BLEU / ROUGE /
    BERTScore of its chosen outputs against beam search's). Returns beam search's own
    summary: tokens, its outputs' text metrics against the reference and mean reward."""
    from omegaconf import open_dict

    from stopexp.evaluate_beam import evaluate_beam
    from stopexp.metrics import BertScorer, text_metrics
    from stopexp.rewards import build_reward, references
    from stopexp.tasks import build_task

    beam_cfg = cfg.copy()
    with open_dict(beam_cfg):
        beam_cfg.search.name = "beam"
    beam, texts, ids = evaluate_beam(beam_cfg, ["no_prune"], {}, int(np.max(prompt_ids)) + 1)
    by_id = dict(zip(ids, texts["no_prune"]))
    missing = [int(p) for p in prompt_ids if int(p) not in by_id]
    if missing:
        raise ValueError(f"beam search skipped prompts {missing[:5]} that the evaluation has")
    beam_texts = [by_id[int(p)] for p in prompt_ids]
    task = build_task(cfg.task)
    level = getattr(task, "text_level", "word")
    scorer = BertScorer(cfg.evaluate.bertscore_model) if cfg.evaluate.bertscore_model else BertScorer()
    for name, hyps in chosen.items():
        results[name]["text_vs_beam"] = text_metrics(list(hyps), beam_texts, level=level, scorer=scorer,
                                                     tokenize=task.tokenize)
    problems = task.problems(cfg.evaluate.split, int(np.max(prompt_ids)) + 1)
    probs = [problems[int(p)] for p in prompt_ids]
    reward = build_reward(cfg.reward)
    out = {"beam_width": cfg.search.beam_width, "tokens_total": beam["no_prune"]["tokens_total"],
           "accuracy": beam["no_prune"]["accuracy"],
           "text_vs_reference": text_metrics(beam_texts, [references(task, p) for p in probs],
                                             level=level, scorer=scorer, tokenize=task.tokenize)}
    if not reward.needs_logprobs:  # beam hypotheses carry no sampled log-probs
        out["mean_reward"] = float(reward.scores(task, probs, beam_texts).mean())
    return out
