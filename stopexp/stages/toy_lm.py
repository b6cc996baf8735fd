"""Train the embedded toy LM from scratch and show it solving test prompts.

    python -m stopexp.toy_lm                      # retrain into the cache, then report
    python -m stopexp.toy_lm model.toy.seed=1     # another seed, another cache entry
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from stopexp.config import ConfigError
from stopexp.core.errors import writing
from stopexp.models.toy_lm import lm_task, toy_key, train_toy_lm
from stopexp.runtime.artifacts import artifact_lock, replace_dir, staging_dir
from stopexp.search.decode import make_engine
from stopexp.search.sample import sample_paths
from stopexp.stages import build
from stopexp.stages.cli import Stage, stage_main
from stopexp.tasks import build_task
from stopexp.metrics.answers import vote
from stopexp.tasks.arith import extract_answer

log = logging.getLogger(__name__)


def solve_report(cfg, model, tokenizer, n_prompts: int = 100, n_paths: int = 32) -> dict:
    """Per-path and majority-vote accuracy on test prompts at the search's sampling."""
    task = build_task(cfg.task)
    problems = task.problems("test", n_prompts)
    params = build.sampling(cfg)
    engine = make_engine(model, tokenizer, params)
    start = time.time()
    paths = sample_paths(engine, tokenizer, task, problems, n_paths, seed=cfg.seed,
                         max_rows=cfg.search.max_batch_rows)
    by_prompt: dict[int, list] = {}
    for p in paths:
        by_prompt.setdefault(p.problem_index, []).append(p)
    votes = [vote([extract_answer(p.text) for p in ps]) == problems[i].answer
             for i, ps in by_prompt.items()]
    report = {"prompts": n_prompts, "paths_per_prompt": n_paths,
              "path_accuracy": sum(p.correct for p in paths) / len(paths),
              "vote_accuracy": sum(votes) / len(votes),
              "seconds": round(time.time() - start, 1)}
    examples = [p for p in by_prompt[0] if p.correct][:2] + [p for p in by_prompt[0] if not p.correct][:2]
    for p in examples:
        log.info("  %s %s  %s", problems[0].prompt, p.text, "right" if p.correct else "wrong")
    log.info("toy LM on %d test prompts x %d paths: per-path accuracy %.3f, majority vote %.3f",
             n_prompts, n_paths, report["path_accuracy"], report["vote_accuracy"])
    return report


@stage_main("toy_lm", tracked=False)
def main(stage: Stage) -> dict:
    cfg = stage.cfg
    from omegaconf import OmegaConf

    if cfg.model.name != "toy":
        raise ConfigError(f"model={cfg.model.name}: python -m stopexp.toy_lm trains only model=toy")
    final = Path(cfg.paths.cache_dir) / "toy_lm" / toy_key(cfg.model.toy, cfg.task)
    with artifact_lock(final), writing(final):  # a full disk names the model, not its temporary dir
        tmp = staging_dir(final)  # under the lock: no one loads the model while it is replaced
        info = train_toy_lm(cfg.model.toy, build_task(OmegaConf.create(lm_task(cfg.model.toy, cfg.task))), tmp)
        replace_dir(tmp, final)  # the old model stays whole until the new one is in place
    log.info("toy LM saved to %s (%d parameters, %d steps, %.0f s)", final,
             info["parameters"], info["steps"], info["train_seconds"])
    model, tokenizer = build.lm(cfg)
    report = solve_report(cfg, model, tokenizer)
    return {"toy_lm": {k: v for k, v in info.items() if k != "history"}, "test": report,
            "checkpoint": str(final)}

