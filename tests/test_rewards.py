"""Rewards, the data-to-text task, reward-ordered losses, rank metrics on a continuous
reward, selection instead of voting, and their config errors."""
import math
import re

import numpy as np
import pytest
import sacrebleu
import torch
from rouge_score.rouge_scorer import RougeScorer
from scipy.stats import kendalltau, spearmanr

from conftest import compose
from stopexp.config import ConfigError, LossConfig, validate
from stopexp.store.path_table import Paths
from stopexp.evaluation.accounting import outcome
from stopexp.evaluation.select import pick
from stopexp.metrics import reward_ranking, within_prompt_auroc
from stopexp.runtime.artifacts import plain
from stopexp.store.keys import sampling_section
from stopexp.tasks import build_task
from stopexp.tasks.task import Task
from stopexp.tasks.datatotext import DataToTextTask
from stopexp.tasks.rewards import Reward, bleu, neg_perplexity, register_reward, rouge_l
from stopexp.training.losses import build_loss
from stopexp.stages import build

HYP = "The Eagle is a cheap French place in the riverside."
REFS = ["The Eagle serves cheap French food in the riverside.",
        "In the riverside, The Eagle offers French food at cheap prices."]


# ---- rewards -------------------------------------------------------------------------------

def test_text_rewards_equal_the_libraries_own_values():
    scorer = RougeScorer(["rougeL"])
    own = max(scorer.score(r, HYP)["rougeL"].fmeasure for r in REFS)
    assert rouge_l(HYP, REFS) == pytest.approx(own, abs=1e-12)
    assert rouge_l(HYP, REFS) == pytest.approx(2 * 0.7 * 7 / 9 / (0.7 + 7 / 9), abs=1e-12)  # LCS 7: P 7/10, R 7/9
    assert bleu(HYP, REFS) == pytest.approx(sacrebleu.sentence_bleu(HYP, REFS).score / 100, abs=1e-12)
    assert bleu(HYP, REFS) == pytest.approx(0.317023313852343, abs=1e-9)
    assert bleu(REFS[0], REFS) == pytest.approx(1.0) and rouge_l(REFS[1], REFS) == pytest.approx(1.0)
    # characters for the arithmetic task: operators count
    assert rouge_l("1+2=3", ["1-2=9"], level="char") == pytest.approx(0.6)


def test_neg_perplexity_is_minus_exp_of_the_mean_negative_logprob():
    assert neg_perplexity([-1.0, -2.0, -3.0]) == pytest.approx(-math.exp(2.0))
    assert neg_perplexity([0.0]) == -1.0
    with pytest.raises(ValueError, match="without generated tokens"):
        neg_perplexity([])


def test_reward_scores_paths_of_a_task():
    task = DataToTextTask(shots=0)
    rec = task.problems("test", 1)[0]
    good = " " + task.references(rec)[1] + "\n"
    texts = [good, " Strada is nice."]
    assert Reward("correct").scores(task, [rec, rec], texts).tolist() == [1.0, 0.0]
    r = Reward("rouge_l").scores(task, [rec, rec], texts)
    assert r[0] == 1.0 and 0 < r[1] < 0.3
    lp = [np.array([-0.5, -0.5]), np.array([-2.0])]
    assert Reward("neg_perplexity").scores(task, [rec, rec], texts, lp) == pytest.approx(
        [-math.exp(0.5), -math.exp(2.0)])
    register_reward("length_share", lambda problem, text: len(text) / 100)
    assert Reward("external", "length_share").scores(task, [rec], ["x" * 30]).tolist() == [0.3]
    bert = Reward("bertscore").scores(task, [rec, rec], texts)
    assert bert[0] == pytest.approx(1.0, abs=1e-5) and bert[1] < bert[0]


def test_an_edited_external_reward_module_scores_and_keys_by_its_new_content(tmp_path, monkeypatch):
    """A module:function reward edited in place during one process (a notebook) is read
    again, and the bank's key follows its content."""
    import sys

    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "my_edited_reward.py"
    module.write_text("def score(problem, text):\n    return 0.25\n")
    monkeypatch.delitem(sys.modules, "my_edited_reward", raising=False)
    task = DataToTextTask(shots=0)
    rec = task.problems("test", 1)[0]
    cfg = compose("collect", ["reward=external", "reward.function=my_edited_reward:score"])
    key = build.bank(cfg).key
    assert Reward("external", "my_edited_reward:score").scores(task, [rec], ["x"]).tolist() == [0.25]
    assert build.bank(cfg).key == key  # the same content, the same bank
    module.write_text("def score(problem, text):\n    return 0.75\n")  # same length, same second
    assert Reward("external", "my_edited_reward:score").scores(task, [rec], ["x"]).tolist() == [0.75]
    assert build.bank(cfg).key != key
    monkeypatch.delitem(sys.modules, "my_edited_reward", raising=False)


# ---- the task ------------------------------------------------------------------------------

def test_datatotext_task_is_seeded_split_and_checked_by_its_slots():
    task = DataToTextTask(shots=2)
    a, b = task.problems("test", 20), DataToTextTask(shots=2).problems("test", 20)
    assert [p.prompt for p in a] == [p.prompt for p in b]
    train = {p.data for p in task.problems("train", 100)}
    assert not train & {p.data for p in a} and all(task.split_of(p.data) == "test" for p in a)
    rec = next(p for p in a if dict(p.values).get("rating"))
    refs = task.references(rec)
    assert len(refs) == 8 and len(set(refs)) == 8  # 4 templates x 2 rating clauses
    assert all(task.grade(rec, " " + r + "\nRecord:") for r in refs)
    assert task.reference(rec) == refs[0]
    values = dict(rec.values)
    wrong = refs[0].replace(f"rated {values['rating']}", f"rated {int(values['rating']) % 5 + 1}")
    assert not task.grade(rec, wrong) and not task.grade(rec, refs[0].split(".")[0] + ".")
    assert task.answer_of(refs[0]) == task.answer_of(refs[3])  # the vote is on content
    assert a[0].prompt.count("Record:") == 3 and a[0].prompt.endswith("Sentence:")
    cfg = compose("collect", ["task=datatotext", "model.chat_template=false", "task.shots=0"])
    assert isinstance(build_task(validate(cfg).task), DataToTextTask)


# ---- losses on a continuous reward ---------------------------------------------------------

BATCH = {"group": torch.tensor([0, 0, 0, 1, 1]),
         "correct": torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]),
         "reward": torch.tensor([0.9, 0.5, 0.45, 0.8, 0.2]),
         "mc": torch.full((5,), float("nan")),
         "remaining": torch.tensor([10.0, 0.0, 5.0, 2.0, 1.0]),
         "prefix_len": torch.tensor([4.0, 4.0, 4.0, 4.0, 4.0])}
SCORES = torch.tensor([0.2, 0.4, -0.1, 1.0, 0.3])


def test_contrastive_orders_pairs_by_reward_with_a_margin_on_the_gap():
    # pairs (gap > 0.1): (0,1) gap .4, (0,2) gap .45, (3,4) gap .6; (1,2) gap .05 is skipped
    expected = (max(0, 0.4 - (0.2 - 0.4)) + max(0, 0.45 - (0.2 + 0.1)) + max(0, 0.6 - (1.0 - 0.3))) / 3
    loss = build_loss(LossConfig(name="contrastive", margin=1.0, min_gap=0.1))(SCORES, BATCH)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx(0.25, abs=1e-6)
    # without a reward in the batch: outcome pairs and the plain margin
    outcome_only = {k: v for k, v in BATCH.items() if k != "reward"}
    assert build_loss(LossConfig(name="contrastive"))(SCORES, outcome_only).item() == pytest.approx(
        (max(0, 1 - (0.2 - 0.4)) + max(0, 1 - (0.2 + 0.1))) / 2, abs=1e-6)


def test_reward_regression_losses_aim_at_the_reward():
    sig = torch.sigmoid(SCORES)
    target = BATCH["reward"] * 0.9 ** BATCH["remaining"]  # discounted future reward
    mse = build_loss(LossConfig(name="mse", discount=0.9))(SCORES, BATCH)
    assert mse.item() == pytest.approx(((sig - target) ** 2).mean().item(), abs=1e-7)
    assert mse.item() == pytest.approx(0.0543473, abs=1e-6)
    bce = build_loss(LossConfig(name="reward_regression"))(SCORES, BATCH)
    assert bce.item() == pytest.approx(0.6656335, abs=1e-6)  # soft BCE on the reward (no MC label)
    assert bce.item() == pytest.approx(torch.nn.functional.binary_cross_entropy_with_logits(
        SCORES, BATCH["reward"]).item(), abs=1e-7)


# ---- rank metrics --------------------------------------------------------------------------

def test_reward_ranking_against_scipy_on_a_hand_example():
    s = np.array([0.1, 0.4, 0.3, 0.9, 5.0, 5.0, 5.0, 1.0, 2.0])
    r = np.array([0.2, 0.8, 0.5, 0.6, 0.1, 0.9, 0.3, 0.7, 0.7])
    g = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2])
    m = reward_ranking(s, r, g)
    rho0, tau0 = spearmanr(s[:4], r[:4]).statistic, kendalltau(s[:4], r[:4]).statistic
    # prompt 1: constant scores order nothing (0); prompt 2: constant reward is left out
    assert m["prompts_ranked"] == 2
    assert m["spearman_within"] == pytest.approx((rho0 + 0) / 2) and rho0 == pytest.approx(0.8)
    assert m["kendall_within"] == pytest.approx((tau0 + 0) / 2) and tau0 == pytest.approx(2 / 3)
    above = np.array([0, 1, 0, 1, 0, 1, 0, 0, 0], bool)  # above each prompt's median
    assert m["auroc_above_median"] == pytest.approx(within_prompt_auroc(s, above, g))
    assert m["auroc_above_median"] == pytest.approx((1.0 + 0.5) / 2)


# ---- selection -----------------------------------------------------------------------------

def seeded_paths():
    """Two prompts of four paths; path 3 of prompt 0 ended before the check."""
    rng = np.random.default_rng(0)
    reward = np.round(rng.uniform(size=8), 3)
    return Paths(group=np.repeat([0, 1], 4), path_id=np.tile(np.arange(4), 2),
                 length=np.array([20, 22, 18, 5, 20, 21, 19, 25]),
                 correct=reward > 0.5, answer=np.array(list("abcdefgh"), dtype=object),
                 text=np.array([f"t{i}" for i in range(8)], dtype=object),
                 alive=np.array([1, 1, 1, 0, 1, 1, 1, 1], bool), batch={},
                 reward=reward, lm_score=np.array([-1.0, -0.5, -0.7, -0.1, -0.9, -0.2, -0.2, -3.0]))


def test_selection_picks_the_best_kept_path_by_each_rule():
    p = seeded_paths()
    assert p.reward.tolist() == [0.637, 0.27, 0.041, 0.017, 0.813, 0.913, 0.607, 0.729]
    kept = np.array([1, 0, 1, 0, 0, 1, 1, 0], bool)   # kept live paths (path 3 ended: it finishes)
    scores = np.array([0.3, 9.0, 0.8, 0.0, 5.0, 0.1, 0.2, 7.0])
    chosen = lambda mode: list(outcome(p, kept, 10, 4, signal=scores, select=mode)["chosen"])
    assert chosen("signal") == ["t2", "t6"]      # best score among kept live: 0.8 of t2; 0.2 of t6
    assert chosen("lm_score") == ["t3", "t5"]    # t3 ended early (finishes), -0.1 the best
    assert chosen("oracle") == ["t0", "t5"]      # best reward among finishing: 0.637, 0.913
    o = outcome(p, kept, 10, 4, signal=scores, select="oracle")
    assert o["reward"].tolist() == [0.637, 0.913]
    assert o["avg_reward"] == pytest.approx([(0.637 + 0.041 + 0.017) / 3, (0.913 + 0.607) / 2])
    assert o["correct"].tolist() == [True, True]
    # no score of its own (no_prune): signal falls back to the LM score, ties to the first path
    assert list(outcome(p, np.ones(8, bool), 10, 4, select="signal")["chosen"]) == ["t3", "t5"]
    assert pick(np.array([5, 6]), "lm_score", np.array([5, 6]), None, p.lm_score, None) == 5
    with pytest.raises(ValueError, match="evaluate.select"):
        pick(np.array([0]), "best", np.array([0]), None, p.lm_score, p.reward)


# ---- config --------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides,key", [
    (["reward=external"], "reward.function"),
    (["reward=external", "reward.function=no.such:thing"], "reward.function"),
    (["reward=rouge_l", "reward.function=x:y"], "reward.function"),
    (["reward=rouge_l", "reward.bertscore_model=/x"], "reward.bertscore_model"),
    (["reward=neg_perplexity", "loss=mse"], "loss.name"),
    (["reward=neg_perplexity", "loss=reward_regression"], "loss.name"),
    (["reward=neg_perplexity", "evaluate.mode=online"], "evaluate.mode"),
    (["reward.name=meteor"], "reward.name"),
    (["evaluate.select=best"], "evaluate.select"),
    (["loss.min_gap=-0.1"], "loss.min_gap"),
    (["loss=reward_regression", "loss.labels=soft"], "loss.labels"),
    (["loss.labels=reward"], "loss.labels"),  # contrastive reads no labels
    # Monte Carlo labels at tap.checkpoints only, not at a stride position the features hold
    (["loss=reward_regression", "collect.mc_rollouts=2", "tap.positions.stride=10",
      "train.checkpoint=10", "search.check_at=10"], "train.checkpoint"),
    (["search=beam", "policy=quantile", "evaluate.select=signal"], "evaluate.select"),
    (["search=beam", "policy=quantile", "evaluate.compare_beam=true"], "evaluate.compare_beam"),
])
def test_reward_and_selection_config_errors_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"^{key}:"):
        validate(compose("pipeline", overrides))


def test_reward_is_in_the_bank_key_only_when_not_the_outcome():
    from stopexp.runtime.artifacts import config_hash
    from stopexp.store import bank

    cfg = compose("collect")
    model = {k: v for k, v in plain(cfg.model).items()
             if k not in ("max_batch_tokens", "long_prompts", "device_map", "max_prompt_tokens", "thinking")}
    model["toy"] = {k: v for k, v in model["toy"].items() if k != "train_task"}
    task = {k: v for k, v in plain(cfg.task).items() if k not in ("tokenize", "solution_style", "shot_match",
                                                                   "prompt_offset", "components")}  # left out at their defaults
    by_hand = config_hash({"version": bank.BANK_VERSION, "model": model, "task": task,
                          "tap": {},  # no Monte Carlo rollouts: no checkpoints in the key
                          "search": sampling_section(cfg.search),
                          "collect": {k: v for k, v in plain(cfg.collect).items() if k not in ("rank", "world")},
                          "seed": 0})
    assert build.bank(cfg).key == by_hand  # reward=correct (the default): not in the key
    assert build.bank(compose("collect", ["reward=rouge_l"])).key != by_hand
    assert build.bank(compose("collect", ["reward=rouge_l"])).key != build.bank(compose("collect", ["reward=bleu"])).key


def test_text_metrics_take_several_references_per_output():
    from stopexp.metrics import text_metrics

    hyps = [HYP, "Strada is cheap."]
    refs = [REFS, ["Strada is a cheap place.", "Strada serves cheap food.", "Strada is cheap and Thai."]]
    m = text_metrics(hyps, refs, bertscore=False)
    # sacrebleu's multi-reference streams (the shorter list padded by its last reference)
    streams = [[REFS[0], refs[1][0]], [REFS[1], refs[1][1]], [REFS[1], refs[1][2]]]
    assert m["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, streams).score, abs=1e-9)
    scorer = RougeScorer(["rougeL"])
    best = [max(scorer.score(r, h)["rougeL"].fmeasure for r in rs) for h, rs in zip(hyps, refs)]
    assert m["rougeL"] == pytest.approx(np.mean(best), abs=1e-12)
    single = text_metrics(hyps, [REFS[1], refs[1][2]], bertscore=False)  # one reference each
    assert single["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [[REFS[1], refs[1][2]]]).score)
    assert m["rougeL"] > single["rougeL"]


# ---- bounded rewards: rounding clipped and counted, real violations refused ----------------

def test_bounded_metrics_clip_rounding_and_refuse_real_violations():
    from stopexp.metrics.bounds import BOUND_SLACK, clip_to_range

    clipped, n = clip_to_range([0.5, 1.0000001, -3e-7, 1.0, 1 + BOUND_SLACK], "BERTScore F1")
    assert clipped.tolist() == [0.5, 1.0, 0.0, 1.0, 1.0] and n == 3
    with pytest.raises(ValueError, match=r"sentence BLEU: 1 of 3 scores lie outside \[0, 1\] by more "
                                         r"than rounding \(1e-05\), e.g. 1.00002 \(position 2\)"):
        clip_to_range([0.2, 1.0, 1.00002], "sentence BLEU")
    with pytest.raises(ValueError, match=r"e.g. nan \(position 0\)"):
        clip_to_range([float("nan")], "ROUGE-L F")
    # corpus BLEU's range is [0, 100]: the slack scales with it
    assert clip_to_range([100.00000000000004, 100.0009], "BLEU", 100.0)[0].tolist() == [100.0, 100.0]
    with pytest.raises(ValueError, match=r"BLEU: 1 of 1 scores lie outside \[0, 100\] by more than "
                                         r"rounding \(0.001\), e.g. 100.002"):
        clip_to_range([100.002], "BLEU", 100.0)


def test_bertscore_of_identical_text_stays_in_0_1_and_counts_the_clipped():
    from stopexp.metrics.text_similarity import BertScorer

    task = DataToTextTask(shots=0)
    recs = task.problems("test", 12)
    texts = [task.references(r)[0] for r in recs]
    # float32 cosines: bert_score's own F1 of an identical pair may round past 1 (1.0000002
    # here); the metric clips it, where the bound is defined
    raw = BertScorer().scorer.score(texts, texts)[2].numpy().astype(np.float64)
    direct = BertScorer().scores(texts, texts)
    assert direct["f1"].tolist() == np.minimum(raw, 1.0).tolist()
    assert direct["clipped"] == int((raw > 1).sum())
    assert BertScorer().score(texts, texts) <= 1.0
    reward = Reward("bertscore")
    got = reward.scores(task, recs, texts)
    assert got.tolist() == direct["f1"].tolist() and reward.clipped == direct["clipped"]


@pytest.mark.parametrize("text, level", [("hello", "word"), ("hello world", "word"),
                                         ("the cat sat on the mat", "word"), ("12", "char")])
def test_sentence_bleu_of_identical_text_is_one_as_sacrebleu_scores_sentences(text, level):
    from stopexp.metrics.text_similarity import bleu as corpus_bleu

    spaced = " ".join(text) if level == "char" else text
    # sacrebleu's sentence_bleu defaults (exp smoothing, effective order: what it recommends
    # for single sentences) score an identical text 100 up to rounding in exp(sum of logs)
    want = sacrebleu.sentence_bleu(spaced, [spaced]).score
    assert want == pytest.approx(100.0, rel=1e-12)
    assert bleu(text, [text], level) == 1.0  # the reward, called directly: in its bound
    task = _ChineseTask("13a")  # references(problem) = [problem]
    task.text_level = level
    assert Reward("bleu").scores(task, [text], [text]).tolist() == [1.0]
    if len(spaced.split()) < 4:  # no 4-gram: unsmoothed corpus BLEU (the text metric) is 0
        assert sacrebleu.corpus_bleu([spaced], [[spaced]]).score == 0.0
        assert corpus_bleu([spaced], [spaced]) == 0.0
    else:  # the corpus metric, called directly, stays within [0, 100] too
        assert corpus_bleu([spaced], [spaced]) == min(sacrebleu.corpus_bleu([spaced], [[spaced]]).score, 100.0)
        assert corpus_bleu([spaced], [spaced]) == pytest.approx(100.0, rel=1e-12)


def test_regression_losses_clip_rounded_rewards_and_name_real_violations_in_full_digits():
    from stopexp.training.data import check_reward_range

    cfg = compose("train", ["loss=mse", "reward=bertscore"])
    data = {"train": {"reward": torch.tensor([0.7773, 1.0000001, 1.0]),
                      "mc": torch.tensor([float("nan"), 1.0000002, 0.5])}}
    assert check_reward_range(cfg.loss, cfg.reward.name, data) == 2
    assert data["train"]["reward"].tolist() == torch.tensor([0.7773, 1.0, 1.0]).tolist()
    assert data["train"]["mc"][1:].tolist() == [1.0, 0.5] and data["train"]["mc"][0].isnan()
    with pytest.raises(ValueError, match=r"the val paths' rewards \(reward=bertscore\) span "
                                         r"\[0.7773, 1.0001\], outside \[0, 1\] by more than rounding"):
        check_reward_range(cfg.loss, cfg.reward.name, {"val": {"reward": torch.tensor([0.7773, 1.0001])}})


# ---- text rewards of non-Latin text ---------------------------------------------------------

class _ChineseTask(Task):
    """A word-level task whose references are Chinese (the interface text rewards read)."""
    name = "chinese"
    text_level = "word"

    def __init__(self, tokenize):
        self.tokenize = tokenize

    @classmethod
    def from_config(cls, task_cfg):
        return cls(task_cfg.tokenize)

    def problems(self, split, n):
        return []

    def grade(self, problem, completion):
        return completion == problem

    def answer_of(self, completion):
        return completion

    def reference(self, problem):
        return problem

    def references(self, problem):
        return [problem]


def test_text_rewards_of_chinese_use_the_task_tokenizer():
    ref, hyp = "猫坐在垫子上看着窗外的小鸟", "猫坐在垫子上看着窗外"
    task = _ChineseTask("zh")
    # LCS 10 of 10 and 13 characters: F = 2PR / (P + R) = 20/23, up to a few ulps of rounding
    assert Reward("rouge_l").scores(task, [ref, ref], [ref, hyp]) == pytest.approx([1.0, 20 / 23], abs=1e-12)
    want = [sacrebleu.sentence_bleu(h, [ref], tokenize="zh").score / 100 for h in (ref, hyp)]
    reward = Reward("bleu")
    # sacrebleu's 100.00000000000004 for the identical pair: a rounding excursion, clipped
    assert reward.scores(task, [ref, ref], [ref, hyp]).tolist() == np.minimum(want, 1.0).tolist()
    assert want[0] == pytest.approx(1.0) and 0 < want[1] < 1 and reward.clipped == (want[0] > 1)
    with pytest.raises(ValueError, match="task.tokenize: '13a' splits words at spaces"):
        Reward("bleu").scores(_ChineseTask("13a"), [ref], [ref])


def test_task_tokenize_is_validated_passed_to_the_task_and_keys_the_bank():
    base = ["+exp=toy_datatotext", "reward=bleu"]
    assert build_task(validate(compose("collect", [*base, "task.tokenize=zh"])).task).tokenize == "zh"
    assert build_task(validate(compose("collect", base)).task).tokenize == "13a"
    assert build.bank(compose("collect", [*base, "task.tokenize=zh"])).key != build.bank(compose("collect", base)).key
    with pytest.raises(ConfigError, match="task.tokenize: 'flores200' is not allowed; allowed: 13a, intl, zh, char"):
        validate(compose("collect", [*base, "task.tokenize=flores200"]))
    with pytest.raises(ConfigError, match=re.escape("task.tokenize: 'zh' is read only by "
                                                    "task=qa|wordprob|datatotext, not under task=arith")):
        validate(compose("collect", ["task.tokenize=zh"]))


def test_hard_labels_train_anywhere_the_features_hold():
    over = ["loss=reward_regression", "collect.mc_rollouts=2", "tap.positions.stride=10",
            "train.checkpoint=10", "search.check_at=10"]
    with pytest.raises(ConfigError, match=r"add it to tap.checkpoints, or train on the outcomes "
                                          r"with loss.labels=reward$"):
        validate(compose("train", over))
    assert validate(compose("train", [*over, "loss.labels=reward"])).train.checkpoint == 10
    assert validate(compose("train", [*over, "train.checkpoint=0.08"])).train.checkpoint == 0.08
