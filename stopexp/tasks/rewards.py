"""A path's reward: a float stored in the bank beside its 0/1 outcome (`correct`), the
label that the losses order or regress and that Monte Carlo rollouts average.

    correct         1.0 when task.grade accepts the text, else 0.0
    rouge_l         ROUGE-L F-measure (rouge-score) against the task's references, the best one
    bleu            sentence BLEU (sacrebleu, all references at once) / 100
    bertscore       BERTScore F1 (bert-score, offline MiniLM by default), the best reference
    neg_perplexity  -exp(-mean log-prob of the generated tokens): the bank's token_logprob,
                    i.e. under the sampling distribution (temperature, top-k, top-p applied)
    external        fn(problem, text) -> float, registered with `register_reward` or given
                    as module:function
    evaluate        a Hugging Face `evaluate` module by local path or cached name
                    (reward.module, reward.key: stopexp.tasks.evaluate_reward)

Text rewards compare words for natural language and characters for tasks whose outputs
have no spaces (`task.text_level == "char"`, the arithmetic task), as stopexp.metrics.text_similarity
does. References come from `task.references(problem)` when the task has several, else
`[task.reference(problem)]`. `BOUNDED` (stopexp.core.names.BOUNDED_REWARDS, with the
reward registry): the rewards validate lets the regression losses (mse,
reward_regression) use: the built-in ones in [0, 1], and external and evaluate, whose range only their
values tell (train checks them: stopexp.training.data.check_reward_range). The text metrics
clip a value that leaves their range by floating-point rounding only
(stopexp.metrics.bounds) and refuse one further out; the values clipped while scoring are
counted (`Reward.clipped`, each shard's record in the bank).
"""
from __future__ import annotations

import math

import numpy as np

from stopexp.core.errors import ConfigError
from stopexp.core.names import BOUNDED_REWARDS as BOUNDED  # noqa: F401
from stopexp.core.names import register_reward, resolve_external  # noqa: F401  (re-exported)
from stopexp.metrics.bounds import clip_to_range
from stopexp.metrics.text_similarity import BertScorer, check_script, check_tokenize, rouge_scorer
from stopexp.tasks.evaluate_reward import EvaluateReward


def references(task, problem) -> list[str]:
    """The task's references for `problem` (several where the task has them)."""
    return list(task.references(problem))


def _spaced(texts, level: str) -> list[str]:
    return [" ".join(t) for t in texts] if level == "char" else list(texts)


def rouge_l(hyp: str, refs: list[str], level: str = "word", tokenize: str = "13a") -> float:
    """ROUGE-L F-measure of `hyp` against the best of `refs`, in [0, 1] (`rouge_l_scores`)."""
    return float(rouge_l_scores([hyp], [refs], level, tokenize)[0][0])


def rouge_l_scores(hyps, refs, level: str = "word", tokenize: str = "13a") -> tuple[np.ndarray, int]:
    """ROUGE-L F-measure of each hyps[i] against the best of refs[i] (rouge-score's
    score_multi; words split as stopexp.metrics.text_similarity.UnicodeTokenizer(tokenize) does), in
    [0, 1], and how many were clipped into it (rounding: stopexp.metrics.bounds)."""
    scorer = rouge_scorer(("rougeL",), level == "char", tokenize)
    out = []
    for hyp, r in zip(hyps, refs, strict=True):
        if level != "char":
            check_script(r, tokenize)
        out.append(scorer.score_multi(_spaced(r, level), _spaced([hyp], level)[0])["rougeL"].fmeasure)
    return clip_to_range(out, "ROUGE-L F")


def bleu(hyp: str, refs: list[str], level: str = "word", tokenize: str = "13a") -> float:
    """Sentence BLEU of `hyp` against all `refs`, in [0, 1] (`bleu_scores`)."""
    return float(bleu_scores([hyp], [refs], level, tokenize)[0][0])


def bleu_scores(hyps, refs, level: str = "word", tokenize: str = "13a") -> tuple[np.ndarray, int]:
    """sacrebleu's sentence BLEU / 100 of each hyps[i] against all of refs[i] with its
    `tokenize`, in [0, 1] (identical text: 1.0, where sacrebleu gives 100.00000000000004),
    and how many were clipped into it (rounding: stopexp.metrics.bounds)."""
    import sacrebleu

    check_tokenize(tokenize)
    out = []
    for hyp, r in zip(hyps, refs, strict=True):
        if level != "char":
            check_script(r, tokenize)
        # sacrebleu's sentence-level settings, spelt out: exp smoothing and the effective
        # order, without which a text shorter than 4 words (no 4-gram) scores 0 even when
        # it is the reference
        out.append(sacrebleu.sentence_bleu(_spaced([hyp], level)[0], _spaced(r, level),
                                           smooth_method="exp", use_effective_order=True,
                                           tokenize=tokenize).score / 100.0)
    return clip_to_range(out, "sentence BLEU")


def neg_perplexity(logprobs) -> float:
    """-exp(-mean(logprobs)) of one path's generated tokens (natural log-probs)."""
    lp = np.asarray(logprobs, dtype=np.float64)
    if not len(lp):
        raise ValueError("neg_perplexity: a path without generated tokens has no perplexity")
    return float(-np.exp(-lp.mean()))


class Reward:
    """reward.* as a function of paths: `scores(task, problems, texts, logprobs)` returns
    a (P,) float64 array, one reward per path (problems[i] the prompt of texts[i];
    logprobs[i] its generated tokens' log-probs, needed by neg_perplexity only)."""

    def __init__(self, name: str = "correct", function: str | None = None,
                 bertscore_model: str | None = None, module: str | None = None,
                 key: str | None = None):
        if name not in (*BOUNDED, "neg_perplexity"):
            raise ConfigError(f"reward.name: {name!r} unknown; allowed: "
                              f"{', '.join((*BOUNDED, 'neg_perplexity'))}")
        self.name, self.bertscore_model = name, bertscore_model
        self.fn = resolve_external(function) if name == "external" else None
        self.function = function
        self.module = EvaluateReward(module, key) if name == "evaluate" else None
        self.needs_logprobs = name == "neg_perplexity"
        self.clipped = 0  # metric values clipped into [0, 1] so far (rounding: stopexp.metrics.bounds)

    @classmethod
    def from_config(cls, reward_cfg) -> "Reward":
        return cls(reward_cfg.name, reward_cfg.get("function"), reward_cfg.get("bertscore_model"),
                   reward_cfg.get("module"), reward_cfg.get("key"))

    def scores(self, task, problems, texts, logprobs=None) -> np.ndarray:
        texts = list(texts)
        # a thinking model's text rewards compare its answer only (correct: task.grade does)
        answers = list(map(task.answer_text, texts))
        out, clipped = self.BY_NAME[self.name](self, task, problems, texts, answers, logprobs)
        self.clipped += clipped  # by the text metrics, which clip rounding into [0, 1]
        return np.asarray(out, dtype=np.float64)

    # one per reward.name: (task, problems, texts, their answers, logprobs) -> (rewards, clipped)
    def _correct(self, task, problems, texts, answers, logprobs):
        return [float(task.grade(p, t)) for p, t in zip(problems, texts, strict=True)], 0

    def _rouge_l(self, task, problems, texts, answers, logprobs):
        return rouge_l_scores(answers, [references(task, p) for p in problems], *_text_level(task))

    def _bleu(self, task, problems, texts, answers, logprobs):
        return bleu_scores(answers, [references(task, p) for p in problems], *_text_level(task))

    def _bertscore_f1(self, task, problems, texts, answers, logprobs):
        return self._bertscore(task, problems, answers, _text_level(task)[0])

    def _neg_perplexity(self, task, problems, texts, answers, logprobs):
        if logprobs is None:
            raise ValueError("reward neg_perplexity needs the paths' per-token log-probs")
        return [neg_perplexity(lp) for lp in logprobs], 0

    def _evaluate_module(self, task, problems, texts, answers, logprobs):
        return self.module.scores(answers, [references(task, p) for p in problems]), 0

    def _external_fn(self, task, problems, texts, answers, logprobs):
        return [self._external(p, t) for p, t in zip(problems, texts, strict=True)], 0

    BY_NAME = {"correct": _correct, "rouge_l": _rouge_l, "bleu": _bleu, "bertscore": _bertscore_f1,
               "neg_perplexity": _neg_perplexity, "evaluate": _evaluate_module,
               "external": _external_fn}

    def _external(self, problem, text: str) -> float:
        """The external function's reward of one path: a finite number, else ConfigError
        naming reward.function, the path and its problem (a NaN would order no pair and
        poison every mean; an exception inside it is the function's, not stopexp's)."""
        where = f"the path {text[:60]!r} of the problem {str(problem)[:80]!r}"
        try:
            value = self.fn(problem, text)
        except Exception as e:  # noqa: BLE001  (any error of the user's function)
            raise ConfigError(f"reward.function: {self.function!r} raised {type(e).__name__}: {e} "
                              f"on {where}; fix the function (STOPEXP_DEBUG=1 shows its "
                              "traceback) or choose another reward") from e
        try:
            out = float(value)
        except (TypeError, ValueError):
            out = math.nan
        if not math.isfinite(out):
            raise ConfigError(f"reward.function: {self.function!r} returned {value!r} for {where}; "
                              "a reward must be a finite number")
        return out

    def _bertscore(self, task, problems, texts, level: str) -> tuple[np.ndarray, int]:
        """The best F1 over each path's references, in one encoder call per reference slot,
        and how many F1s were clipped (BertScorer.scores)."""
        scorer = BertScorer(self.bertscore_model) if self.bertscore_model else BertScorer()
        refs = [references(task, p) for p in problems]
        hyps = _spaced(texts, level)
        best, clipped = np.full(len(texts), -np.inf), 0
        for k in range(max(map(len, refs), default=0)):
            rows = [i for i, r in enumerate(refs) if k < len(r)]
            d = scorer.scores([hyps[i] for i in rows], _spaced([refs[i][k] for i in rows], level))
            best[rows] = np.maximum(best[rows], d["f1"])
            clipped += d["clipped"]
        return best, clipped


def _text_level(task) -> tuple[str, str]:
    """(level, tokenize) of the text rewards: words or characters (task.text_level) and how
    words are split (task.tokenize)."""
    return task.text_level, task.tokenize


def build_reward(reward_cfg) -> Reward:
    """The reward of `cfg.reward` (ValueError naming reward.* when it is not usable)."""
    return Reward.from_config(reward_cfg)
