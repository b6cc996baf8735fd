"""The task interface (stopexp.tasks.task.Task): every registered task keeps its contract,
a config names a task's capabilities without importing torch, and a task defined outside
the package, registered by one line, composes, validates, builds and grades."""
from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import compose
from stopexp.config import ConfigError, validate
from stopexp.core.names import REGISTRY, lookup, names
from stopexp.tasks import build_task, vote_format
from stopexp.tasks.task import Task

ROOT = Path(__file__).resolve().parents[1]
CLASS_CAPABILITIES = {"text_level": str, "checks_steps": bool, "generated": bool,
                      "formats": tuple, "toy_keys": tuple}


@pytest.mark.parametrize("name", names("task"))
def test_every_registered_task_keeps_the_contract(name):
    cls = lookup("task", name)
    assert issubclass(cls, Task) and not inspect.isabstract(cls)
    assert cls.name == name  # the name it is registered under
    for attr, kind in CLASS_CAPABILITIES.items():
        assert isinstance(getattr(cls, attr), kind), attr
    assert cls.text_level in ("word", "char")
    assert cls.step_separator is None or isinstance(cls.step_separator, str) and cls.step_separator
    assert cls.wrong_value_end is None or callable(cls.wrong_value_end)
    assert cls.toy_chars is None or isinstance(cls.toy_chars, str)
    if cls.toy_keys:  # the toy LM learns it from drawn problems and their solutions
        assert "name" in cls.toy_keys and cls.sample is not Task.sample
        assert cls.training_text is not Task.training_text


def test_the_built_tasks_answer_through_the_interface():
    for name in ("arith", "wordprob", "datatotext"):
        task = build_task(compose("collect", [f"task={name}"]).task)
        problem = task.problems("test", 1)[0]
        ref = task.reference(problem)
        assert task.references(problem)[0] == ref and task.answer_text(ref) == ref
        assert task.grade(problem, ref) or name == "datatotext"  # its reference lacks the rating
        assert vote_format(task) is None and task.end_tag is None and task.split_rows is None
    qa = compose("collect", ["task=gsm8k"]).task
    assert vote_format(qa) == "numeric" and vote_format(compose("collect").task) is None


@pytest.mark.parametrize("option", sorted(p.stem for p in (ROOT / "conf" / "task").glob("*.yaml")))
def test_a_split_grows_by_appending_prompts(option):
    # what lets a bank with more prompts link a smaller bank's shards (stopexp.store.bank_growth)
    task = build_task(compose("collect", [f"task={option}"]).task)
    for split in ("train", "test"):
        n = min(12, len(task.split_rows[split])) if task.split_rows is not None else 12
        more, fewer = task.problems(split, n), task.problems(split, n // 2)
        assert [(p.split, p.prompt) for p in more[: n // 2]] == [(p.split, p.prompt) for p in fewer]


def test_validating_a_task_name_imports_no_torch():
    """The command line's check (what `python -m stopexp.<stage>` runs before the stage), on
    configs whose checks read the task's capabilities: its step separator, its intermediate
    values, its formats, whether it is generated."""
    code = textwrap.dedent("""
        import sys
        from stopexp.runtime.overrides import check_overrides
        for stage, args in (("collect", ["task=arith", "tap.positions.step_ends=true"]),
                            ("evaluate", ["task=wordprob", "model.chat_template=false",
                                          "evaluate.methods=[error_oracle]"]),
                            ("collect", ["task=datatotext", "task.shots=0"]),
                            ("collect", ["task=gsm8k", "tap.positions.step_ends=true"])):
            check_overrides(stage, args, validate_run=True)
        heavy = sorted(m for m in ("torch", "transformers", "vllm") if m in sys.modules)
        print("imported:", heavy)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "imported: []" in out.stdout, out.stdout + out.stderr


def test_the_capabilities_decide_the_config_checks():
    with pytest.raises(ConfigError, match="^task.name: 'bogus' is not allowed; allowed: arith, "):
        validate(compose("collect", ["task.name=bogus"]), machine=False)
    with pytest.raises(ConfigError, match="^tap.positions.step_ends: task datatotext has no step "
                                          "separator .* allowed with tasks arith, qa, wordprob,"):
        validate(compose("collect", ["task=datatotext", "tap.positions.step_ends=true"]),
                 machine=False)


DIGITS = '''
"""The sum of a number's digits mod 10: a task from outside the package."""
import random
from dataclasses import dataclass

from stopexp.tasks.task import Task
from stopexp.tasks.splits import hash_split


@dataclass(frozen=True)
class DigitsProblem:
    prompt_id: int
    split: str
    number: str

    @property
    def prompt(self) -> str:
        return f"{self.number}?"

    @property
    def answer(self) -> int:
        return sum(map(int, self.number)) % 10


class DigitsTask(Task):
    name = "digits"
    text_level = "char"  # outputs without spaces

    def __init__(self, n_digits: int, seed: int, split_fractions: dict):
        self.n_digits, self.seed, self.split_fractions = n_digits, seed, split_fractions

    @classmethod
    def from_config(cls, task_cfg):
        return cls(task_cfg.n_digits, task_cfg.seed, dict(task_cfg.split_fractions))

    def problems(self, split, n):
        rng, seen = random.Random(self.seed), []
        while len(seen) < n:
            number = "".join(rng.choice("0123456789") for _ in range(self.n_digits))
            if hash_split(number, self.split_fractions) == split and number not in seen:
                seen.append(number)
        return [DigitsProblem(i, split, number) for i, number in enumerate(seen)]

    def grade(self, problem, completion):
        return self.answer_of(completion) == str(problem.answer)

    def answer_of(self, completion):
        return completion.rpartition("#")[2].strip()

    def reference(self, problem):
        return f"#{problem.answer}"
'''


@pytest.fixture
def digits(tmp_path, monkeypatch):
    """The task `digits` in tmp_path (its module and conf/task/digits.yaml), registered."""
    (tmp_path / "digits_task.py").write_text(DIGITS)
    (tmp_path / "conf" / "task").mkdir(parents=True)
    (tmp_path / "conf" / "task" / "digits.yaml").write_text("name: digits\nn_digits: 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY["task"], "digits", "digits_task:DigitsTask")
    return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"


def test_a_task_from_outside_the_package_composes_validates_builds_and_grades(digits):
    cfg = validate(compose("collect", ["task=digits", digits, "task.n_digits=4"]), machine=False)
    task = build_task(cfg.task)
    problem = task.problems("test", 2)[1]
    assert len(problem.number) == 4 and task.grade(problem, f"...#{problem.answer}")
    assert not task.grade(problem, "#") and task.answer_of("1+2=3#3") == "3"
    assert vote_format(task) is None and vote_format(cfg.task) is None
    with pytest.raises(ConfigError, match="^task.shots: 5 is read only by task="):
        validate(compose("collect", ["task=digits", digits, "task.shots=5"]), machine=False)
    with pytest.raises(ConfigError, match="^tap.positions.step_ends: task digits has no step"):
        validate(compose("collect", ["task=digits", digits, "tap.positions.step_ends=true"]),
                 machine=False)
