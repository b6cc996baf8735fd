"""Evaluation of beam search with per-step pruning: every method steers the same beam
search on the same prompts, online (beams have no trace bank to replay)."""
from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import numpy as np
import torch

from stopexp.core.names import names as registered
from stopexp.core.policies import build_policy, policy_params
from stopexp.core.protocol import checkpoint_tokens
from stopexp.core.token_text import text_of
from stopexp.evaluation import figures, plots
from stopexp.evaluation.accounting import add_text_metrics
from stopexp.evaluation.online import OnlineLM
from stopexp.metrics import BertScorer, bootstrap_ci, paired_difference, text_metrics
from stopexp.metrics.multiplicity import correct_family
from stopexp.search.beam import beam_search_batch
from stopexp.search.sample import prompt_ids
from stopexp.search.stops import eos_ids
from stopexp.search.taps import Taps
from stopexp.search.trace import has_values
from stopexp.tasks.rewards import build_reward, references

log = logging.getLogger(__name__)


# what beam metrics leave out, said in metrics.json rather than left to guess
NOT_REPORTED = {
    "auroc": "beams are not independent paths with one outcome each: they share prefixes, are "
             "re-ranked and refilled at every step, so AUROC/AUPRC of a method's scores against "
             "path success is undefined; see the parallel protocol (search=parallel) for them",
    "avg_at_k": "one hypothesis per prompt: accuracy is the only per-prompt outcome",
}


def oracle_refusal(task) -> str | None:
    """Why the beam oracle cannot run for this task, or None when it can: it needs a task
    whose `diagnose` finds the first wrong written step (`checks_steps`) or whose written
    intermediate values are checked (`has_values`)."""
    if task.checks_steps or has_values(task):
        return None
    return (f"task {task.name!r} has no process check (no first wrong step can be read from a "
            "prefix), so a beam oracle would score every live beam alike and never prune; the "
            "oracle is left out of beam search for it")


def beam_metrics(lm: OnlineLM, names: list[str], scorers: dict, bank_name: str, start: float,
                 search, tap, policy, evaluate, run=None, run_dir: Path | None = None) -> dict:
    """metrics.json of the evaluate stage for search=beam: every method but those it cannot
    run (said in "omitted_methods") steers a beam search (`evaluate_beam`) on the bank's
    test prompts (`lm`: the LM, task and prompts; bank_name: the trace bank's; start:
    time.time() when the stage began; `search`, `tap`, `policy`, `evaluate`: the config's
    sections). Writes the survival plot into run_dir and the summary to `run` when given."""
    omitted = {}
    if oracle_refusal(lm.task):
        omitted["oracle"] = oracle_refusal(lm.task)
        log.warning("oracle: %s", omitted["oracle"])
        names = [n for n in names if n != "oracle"]
    for n in (n for n in names if n in registered("stopping")):
        omitted[n] = "a stopping protocol over parallel paths; beam search has none"
    names = [n for n in names if n not in registered("stopping")]
    results, texts, prompt_ids = evaluate_beam(lm, names, scorers, search, tap, policy,
                                               evaluate.bootstrap, evaluate.seed)
    not_reported = dict(NOT_REPORTED)
    if evaluate.text_metrics:
        add_text_metrics(lm.task, evaluate.split, evaluate.bertscore_model, np.asarray(prompt_ids),
                         texts, results)
    else:
        not_reported["text_metrics"] = "evaluate.text_metrics=false"
    metrics = {"methods": results, "mode": "online", "search": "beam",
               "protocol": {"beam_width": search.beam_width, "patience": search.patience,
                            "refill": search.refill,
                            "policy": policy.name, "k": policy.keep,
                            "policy_params": policy_params(policy), "prompts": len(prompt_ids),
                            "split": evaluate.split},
               "omitted_methods": omitted, "not_reported": not_reported,
               "bank": bank_name, "eval_wall_s": round(time.time() - start, 2)}
    if run_dir is not None:
        metrics["plots"] = {"survival": str(plots.survival(
            {m: r["survival"] for m, r in results.items()}, run_dir / "survival.png",
            figures.studied_methods(results)))}
    if run is not None:
        run.summary_update({f"{m}/{k}": v for m, r in results.items() for k, v in r.items()
                            if isinstance(v, (int, float))})
    return metrics


def evaluate_beam(lm: OnlineLM, names: list[str], scorers: dict, search, tap, policy,
                  n_boot: int, seed: int) -> tuple[dict, dict, list]:
    """Beam search with per-step pruning, online, per method, on the prompts of `lm`, the
    beams of up to search.max_batch_rows // search.beam_width prompts in one forward
    (search.refill: keep the width or narrow it), taps of `tap`, pruning by `policy`, the
    accuracy's interval from `n_boot` resamples from `seed`. The oracle here is the
    task's process check: a beam whose written steps already contain an error scores 0
    (`prefix_has_error`: tasks that check their steps or have intermediate values).
    Returns per method the metrics and the chosen output text of every prompt, and the
    prompts' ids."""
    task, model, tokenizer, problems = lm.task, lm.model, lm.tokenizer, lm.problems
    s, B = search, search.beam_width
    checks = None if s.beam_checks is None else {
        checkpoint_tokens(c, s.max_new_tokens) for c in s.beam_checks}
    results, texts, eos = {}, {}, eos_ids(model, tokenizer)
    correct_of = {}  # name -> (prompts,) 0/1, for the paired differences
    per_batch = max(1, s.max_batch_rows // B)  # rows of a forward: prompts x beam width
    chunks = [problems[i: i + per_batch] for i in range(0, len(problems), per_batch)]
    stop = lm.params.stop
    with Taps.from_config(model, tap) as taps:
        for name in names:
            correct, tokens, steps, alive = [], 0, [], np.zeros(s.max_new_tokens)
            texts[name] = []
            check_s, start = 0.0, time.perf_counter()
            prune = None if name == "no_prune" else build_policy(policy, keep=policy.keep)
            for chunk in chunks:
                scorer = None if name == "no_prune" else scorers[name]
                if name == "oracle":
                    scorer = _prefix_oracle(task, chunk, tokenizer)
                ids = [prompt_ids(tokenizer, problem.prompt) for problem in chunk]
                found = beam_search_batch(
                    model, ids, beam_width=B, max_new_tokens=s.max_new_tokens, eos_ids=eos,
                    pad_id=tokenizer.pad_token_id, scorer=scorer, policy=prune,
                    patience=s.patience, taps=taps if scorer else None,
                    group_window=s.group_window, conf_topk=s.conf_topk, check_steps=checks,
                    stop=stop, tokenizer=tokenizer, refill=s.refill)
                for problem, prompt, r in zip(chunk, ids, found):
                    texts[name].append(text_of(tokenizer, r.tokens))
                    correct.append(task.grade(problem, texts[name][-1]))
                    tokens += r.n_forward_tokens - len(prompt)
                    steps += r.pruned_steps
                    alive[: len(r.alive_per_step)] += np.asarray(r.alive_per_step) / B
                    check_s += r.check_seconds
            wall = time.perf_counter() - start
            c = np.asarray(correct, float)
            lo, hi = bootstrap_ci(c, n=n_boot, seed=seed)
            correct_of[name] = c
            results[name] = {"accuracy": float(c.mean()), "accuracy_ci": [lo, hi],
                             "tokens_total": float(tokens), "wall_s": wall, "check_s": check_s,
                             "check_share": check_s / max(wall - check_s, 1e-9),
                             "pruned": len(steps), "survival": (alive / len(problems)).tolist(),
                             "mean_prune_step": float(np.mean(steps)) if steps else None}
            log.info("beam search, %s: accuracy %.3f, %d tokens, %.0f s", name, c.mean(), tokens, wall)
    base = results["no_prune"]["tokens_total"]
    for name, r in results.items():
        r["tokens_ratio"] = r["tokens_total"] / base
        if name != "no_prune":  # on the same prompts as plain beam search of the same width
            r["accuracy_vs_no_prune"] = paired_difference(correct_of[name], correct_of["no_prune"],
                                                          n_boot, seed)
    correct_family([r["accuracy_vs_no_prune"] for r in results.values() if "accuracy_vs_no_prune" in r])
    return results, texts, [p.prompt_id for p in problems]


_TRAILING_NUMBER = re.compile(r"\d[\d,]*$")  # "1,0" may still become "1,024"


def prefix_has_error(task, problem, text: str) -> bool:
    """Whether a beam's text already shows a wrong step: for tasks with intermediate values
    (`has_values`) a wrong completed value (a number at the end may still grow a digit, so
    it is not read yet), else the task's process check over its complete steps (up to the
    last step separator)."""
    if has_values(task):
        return task.wrong_value_end(problem, _TRAILING_NUMBER.sub("", text)) is not None
    sep = task.step_separator
    done = text[: text.rfind(sep) + len(sep)] if sep and sep in text else ""
    err = task.diagnose(problem, done)["first_error"]
    return 0 <= err < len(done)


def _prefix_oracle(task, problems, tokenizer):
    """1 while a beam shows no wrong step (`prefix_has_error`), else 0; `problems`: the
    prompts of the batched search (a row's prompt is problems[batch["owner"][row]])."""
    def score(batch):
        return torch.tensor([
            0.0 if prefix_has_error(task, problems[i], text_of(tokenizer, row))
            else 1.0 for row, i in zip(batch["tokens"].tolist(), batch["owner"].tolist())])
    return score


def compare_with_beam(lm: OnlineLM, prompt_ids: np.ndarray, chosen: dict, results: dict,
                      search, tap, reward, evaluate) -> dict:
    """Run plain beam search (search=beam, no pruning: `evaluate_beam`'s no_prune) on the
    evaluated prompts (`lm`: the LM and those prompts, ids up to max(prompt_ids)) and add
    to every method's results `text_vs_beam` (BLEU / ROUGE / BERTScore of its chosen
    outputs against beam search's). Returns beam search's own summary: tokens, its outputs'
    text metrics against the reference and mean reward (`reward`: the reward section)."""
    beam, texts, ids = evaluate_beam(lm, ["no_prune"], {}, search, tap, None, evaluate.bootstrap,
                                     evaluate.seed)
    by_id = dict(zip(ids, texts["no_prune"]))
    missing = [int(p) for p in prompt_ids if int(p) not in by_id]
    if missing:
        raise ValueError(f"beam search skipped prompts {missing[:5]} that the evaluation has")
    beam_texts = [by_id[int(p)] for p in prompt_ids]
    task = lm.task
    level = task.text_level
    scorer = BertScorer(evaluate.bertscore_model) if evaluate.bertscore_model else BertScorer()
    for name, hyps in chosen.items():
        results[name]["text_vs_beam"] = text_metrics(list(hyps), beam_texts, level=level, scorer=scorer,
                                                     tokenize=task.tokenize)
    problems = task.problems(evaluate.split, int(np.max(prompt_ids)) + 1)
    probs = [problems[int(p)] for p in prompt_ids]
    reward_fn = build_reward(reward)
    out = {"beam_width": search.beam_width, "tokens_total": beam["no_prune"]["tokens_total"],
           "accuracy": beam["no_prune"]["accuracy"],
           "text_vs_reference": text_metrics(beam_texts, [references(task, p) for p in probs],
                                             level=level, scorer=scorer, tokenize=task.tokenize)}
    if not reward_fn.needs_logprobs:  # beam hypotheses carry no sampled log-probs
        out["mean_reward"] = float(reward_fn.scores(task, probs, beam_texts).mean())
    return out
