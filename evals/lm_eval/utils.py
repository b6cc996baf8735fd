"""stopexp's tasks for the harness: GSM8K (conf/task/gsm8k.yaml) and the toy's chained
arithmetic (conf/task/arith.yaml), each its test split in its order, its prompts and its
grader, read through stopexp's own task, so that the harness and stopexp's evaluate name
the same prompts and grade a text alike."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

TASKS = Path(__file__).resolve().parents[2] / "conf" / "task"
GSM8K_MARK = re.compile(r"#### (\-?[0-9\.\,]+)")  # GSM8K's strict match, as the harness' gsm8k task


@lru_cache(maxsize=None)
def _task(name: str = "gsm8k"):
    """stopexp's task of conf/task/<name>.yaml (its schema's defaults left out: the file sets
    every key)."""
    from stopexp.tasks import build_task

    config = OmegaConf.load(TASKS / f"{name}.yaml")
    config.pop("defaults", None)
    return build_task(config)


ARITH_TEST = 200  # collect.prompts.test's default: the test prompts the toy's evaluate scores


@lru_cache(maxsize=None)
def _test_problems(name: str) -> list:
    task = _task(name)
    return task.problems("test", len(task.split_rows["test"]) if task.split_rows else ARITH_TEST)


def stopexp_arith(**kwargs):
    """The toy's task (task=arith, +exp=toy_contrastive's): its test split in the order
    stopexp draws it, each row with stopexp's prompt and reference answer."""
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list([
        {"prompt_id": p.prompt_id, "stopexp_prompt": p.prompt, "stopexp_answer": str(p.answer)}
        for p in _test_problems("arith")])})


def process_arith(doc, results) -> dict:
    """acc: stopexp's grade of the returned text (the toy's answer after `#`), what
    evaluate's vote accuracy counts."""
    return {"acc": float(_task("arith").grade(_test_problems("arith")[doc["prompt_id"]], results[0]))}


def stopexp_gsm8k(**kwargs):
    """stopexp's test split of the shipped GSM8K file, in the order stopexp draws it (so
    `--limit n` asks the prompts of collect.prompts.test=n), each row with its source
    row, its reference solution, stopexp's prompt and reference answer; the file is read
    by stopexp (no hub access), so the harness may run from any directory."""
    import datasets

    problems = _test_problems("gsm8k")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list([
        {"prompt_id": p.prompt_id, "source_row": p.source_row, "answer": p.reference,
         "stopexp_prompt": p.prompt, "stopexp_answer": p.answer} for p in problems])})


def stopexp_prompt(doc) -> str:
    return doc["stopexp_prompt"]


def _normalise(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def process_results(doc, results) -> dict:
    """acc: stopexp's grade of the answer (task.extraction: the first answer mark, `#### N`,
    `The answer is N` or `\\boxed{N}`, equal values), what stopexp's evaluate reports as vote
    accuracy when the text is the server's chosen path; strict_match: GSM8K's first
    `#### N`, string-equal after removing commas, `$` and a final period."""
    from stopexp.metrics.answers import equivalent

    task, text = _task(), results[0]
    marked = GSM8K_MARK.findall(text)
    reference = doc["answer"].split("####")[-1].strip()
    return {"acc": float(equivalent(task.answer_of(text), doc["stopexp_answer"], task.answer_format)),
            "strict_match": float(bool(marked) and _normalise(marked[0]) == _normalise(reference))}
