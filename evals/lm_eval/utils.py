"""stopexp's view of GSM8K for the harness: its test split, in its order, and its prompt
(conf/task/gsm8k.yaml, read through stopexp's own task so that both name the same prompts)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

TASK_YAML = Path(__file__).resolve().parents[2] / "conf" / "task" / "gsm8k.yaml"


@lru_cache(maxsize=1)
def _task():
    from stopexp.tasks.qa import QATask

    cfg = OmegaConf.load(TASK_YAML)
    return QATask(path=cfg.path, answer_format=cfg.answer_format, prompt_template=cfg.prompt_template,
                  question_key=cfg.question_key, answer_key=cfg.answer_key, source_split=cfg.source_split,
                  seed=cfg.seed, split_fractions=dict(cfg.split_fractions), extraction=cfg.extraction)


def stopexp_test_split(dataset):
    """The rows of stopexp's test split, in the order stopexp draws them."""
    return dataset.select(_task().split_rows["test"])


def stopexp_prompt(doc) -> str:
    return OmegaConf.load(TASK_YAML).prompt_template.replace("{question}", doc["question"])
