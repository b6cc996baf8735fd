"""The field's metrics as `evaluate` modules (stopexp/metrics/evaluate_modules), loaded
offline through evaluate.load and equal to stopexp's own numbers; reward=evaluate with a
local module, a cached one, and the errors of one that is not there."""
import shutil
from pathlib import Path

import evaluate
import numpy as np
import pytest

from conftest import compose, references_task
from stopexp.config import ConfigError, validate
from stopexp.metrics import avg_at_k, cons_at_n, evaluate_module, pass_at_1, within_prompt_auroc
from stopexp.core.evaluate_modules import input_features
from stopexp.metrics.evaluate_modules import MODULES
from stopexp.store.keys import reward_section
from stopexp.tasks.datatotext import DataToTextTask
from stopexp.tasks.rewards import Reward

WORD_RECALL = Path(__file__).parent / "data" / "evaluate" / "word_recall"

# hand-made: 3 prompts; prompt 0 ranks right (1.0), prompt 1 has a tie and one swap
# (pairs: (.6>.2) 1, (.6 vs .6) 0.5, (.5<.6) 0, (.5>.2) 1 -> 2.5/4), prompt 2 one outcome only
SCORES = [0.9, 0.1, 0.4, 0.6, 0.2, 0.6, 0.5, 0.3, 0.7]
LABELS = [1, 0, 1, 1, 0, 0, 1, 1, 1]
GROUPS = [0, 0, 0, 1, 1, 1, 1, 2, 2]
KEPT = [[1, 0, 1, 1], [0, 0], [], [1]]
ANSWERS = [["4", "4", "5"], ["7", None, "8", "8"], [r"\frac{1}{2}", "0.5", "3"]]
GOLD = ["4", "7", "1/2"]


def load(name):
    return evaluate.load(evaluate_module(name))


def test_the_shipped_modules_equal_stopexps_own_numbers():
    auroc = load("within_prompt_auroc")
    got = auroc.compute(predictions=SCORES, references=LABELS, groups=GROUPS)["within_prompt_auroc"]
    assert got == within_prompt_auroc(SCORES, LABELS, GROUPS) == (1.0 + 2.5 / 4) / 2
    named = auroc.compute(predictions=SCORES, references=LABELS, groups=[f"p{g}" for g in GROUPS])
    assert named["within_prompt_auroc"] == got  # prompt ids may be strings
    assert load("avg_at_k").compute(predictions=KEPT)["avg_at_k"] == avg_at_k(KEPT) == (0.75 + 1) / 4
    assert load("pass_at_1").compute(predictions=KEPT[:2])["pass_at_1"] == pass_at_1(KEPT[:2]) == 0.375
    cons = load("cons_at_n")
    assert cons.compute(predictions=ANSWERS, references=GOLD)["cons_at_n"] == \
        cons_at_n(ANSWERS, GOLD) == 1 / 3  # by string, 1/2 is not 0.5
    assert cons.compute(predictions=ANSWERS, references=GOLD, answer_format="boxed")["cons_at_n"] == \
        cons_at_n(ANSWERS, GOLD, "boxed") == 2 / 3  # math-verify: \frac{1}{2} = 0.5 = 1/2
    # a path without an answer does not vote, whether None, "" or blank
    empty = [["", "", "5"], [" ", "7"], [None, "", "8"]]
    assert cons.compute(predictions=empty, references=["5", "7", "8"])["cons_at_n"] == 1.0


def test_each_shipped_module_describes_itself():
    for name in MODULES:
        m = load(name)
        assert m.name == name and len(m.description) > 100 and m.citation.startswith("@")
        assert "Args:" in m.inputs_description and "predictions" in input_features(m)
    with pytest.raises(ValueError, match="no evaluate module 'bleu' ships with stopexp; shipped: "
                                         "within_prompt_auroc, avg_at_k"):
        evaluate_module("bleu")


def _paths():
    task = DataToTextTask(shots=0)
    rec = task.problems("test", 1)[0]
    refs = task.references(rec)
    return task, rec, refs, [refs[1], " ".join(refs[2].split()[:4]), "nothing alike"]


def _recall(text, ref):
    words = set(ref.split())
    return len(set(text.split()) & words) / len(words)


@pytest.mark.parametrize("key", [None, "per_path"])
def test_an_evaluate_reward_is_the_modules_value_against_the_best_reference(key):
    task, rec, refs, texts = _paths()
    reward = Reward("evaluate", module=str(WORD_RECALL), key=key)
    got = reward.scores(task, [rec] * 3, texts)
    want = [max(_recall(t, r) for r in refs) for t in texts]
    # key None: the module's name (word_recall), a corpus mean, computed once per path;
    # per_path: one value per path in one call; the same quotients either way
    assert got.tolist() == want and got[0] == 1.0 and 0 < got[1] < 1


def test_reward_evaluate_validates_and_keys_the_bank_by_the_modules_content(tmp_path):
    copy = tmp_path / "word_recall.py"
    shutil.copy(WORD_RECALL / "word_recall.py", copy)
    cfg = validate(compose("collect", ["reward=evaluate", f"reward.module={copy}"]))
    before = reward_section(cfg.reward)
    copy.write_text(copy.read_text() + "\n# edited\n")
    assert reward_section(cfg.reward)["module_sha256"] != before["module_sha256"]
    # the other rewards keep their keys (no module, no key)
    assert reward_section(validate(compose("collect", ["reward=rouge_l"])).reward) == {
        "name": "rouge_l", "function": None, "bertscore_model": None}


def test_an_edited_module_is_scored_by_its_new_content_in_the_same_process(tmp_path):
    from stopexp.core.evaluate_modules import load_module

    copy = tmp_path / "word_recall.py"
    shutil.copy(WORD_RECALL / "word_recall.py", copy)
    texts, refs = ["a b", "a c"], [["a b"], ["a b"]]
    assert Reward("evaluate", module=str(copy), key="per_path").scores(
        references_task(), refs, texts).tolist() == [1.0, 0.5]
    assert load_module(str(copy)) is load_module(str(copy))  # loaded once per content
    # an edit in place (same path, same process): every path now scores a quarter
    copy.write_text(copy.read_text().replace("per_path = [len(", "per_path = [0.25 + 0 * len("))
    assert Reward("evaluate", module=str(copy), key="per_path").scores(
        references_task(), refs, texts).tolist() == [0.25, 0.25]


def test_a_name_is_read_from_the_evaluate_cache_offline():
    cached = Path(evaluate.config.HF_MODULES_CACHE) / "evaluate_modules" / "metrics" / \
        "evaluate-metric--word_recall" / ("0" * 64)
    cached.mkdir(parents=True, exist_ok=True)
    shutil.copy(WORD_RECALL / "word_recall.py", cached)
    validate(compose("collect", ["reward=evaluate", "reward.module=word_recall"]))
    task, rec, _, texts = _paths()
    assert Reward("evaluate", module="word_recall").scores(task, [rec], texts[:1]).tolist() == [1.0]


@pytest.mark.parametrize("overrides,message", [
    (["reward=evaluate"], "reward.module: reward=evaluate needs a module"),
    (["reward=evaluate", "reward.module=no_such_metric"],
     "reward.module: 'no_such_metric' is neither a local file or directory nor in the evaluate cache"),
    (["reward=evaluate", "reward.module=./nowhere/metric.py"],
     "reward.module: './nowhere/metric.py': no such file or directory"),
    (["reward=evaluate", f"reward.module={WORD_RECALL.parent}"],
     "reward.module: '.*' is a directory without evaluate.py"),
    (["reward=evaluate", f"reward.module={evaluate_module('within_prompt_auroc')}"],
     "reward.module: '.*' reads the inputs groups, predictions, references; a reward module reads"),
    (["reward=rouge_l", f"reward.module={WORD_RECALL}"], "reward.module: '.*' is read only by reward=evaluate, not under reward=rouge_l"),
    (["reward=bleu", "reward.key=bleu"], "reward.key: 'bleu' is read only by reward=evaluate, not under reward=bleu"),
])
def test_reward_evaluate_errors_name_the_key_and_the_module(overrides, message):
    with pytest.raises(ConfigError, match=f"^{message}") as e:
        validate(compose("collect", overrides))
    assert "\n" not in str(e.value)


def test_a_missing_result_key_names_reward_key():
    task, rec, _, texts = _paths()
    with pytest.raises(ConfigError, match=r"^reward.key: 'f1' is not among the keys .* \(word_recall, "
                                          r"per_path\); set reward.key"):
        Reward("evaluate", module=str(WORD_RECALL), key="f1").scores(task, [rec], texts[:1])
    assert np.isfinite(Reward("evaluate", module=str(WORD_RECALL)).scores(task, [rec], texts[:1])).all()
