"""Cons@N as an `evaluate` module (stopexp.metrics.vote_accuracy.cons_at_n)."""
import datasets
import evaluate

from stopexp.metrics.vote_accuracy import cons_at_n

_DESCRIPTION = """Cons@N (majority-vote accuracy, self-consistency): for each prompt, the answer
most of its N paths give (paths without an answer do not vote; ties go to the answer seen
first) is compared with the gold answer; the share of prompts where it is right. With
`answer_format="boxed"`, answers that math-verify proves equal vote as one and match the
gold answer the same way; "numeric" and None compare strings."""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `str`): per prompt, each path's extracted answer
        (None or "" for a path without one).
    references (`list` of `str`): per prompt, the gold answer.
    answer_format (`str`, optional): "boxed" (math-verify equivalence), "numeric", or None.
Returns:
    cons_at_n (`float`): in [0, 1].
Examples:
    >>> cons = evaluate.load(stopexp.metrics.evaluate_module("cons_at_n"))
    >>> cons.compute(predictions=[["4", "4", "5"], ["7", None, "8", "8"]], references=["4", "7"])
    {'cons_at_n': 0.5}
"""

_CITATION = """@inproceedings{wang2023selfconsistency,
  title     = {Self-Consistency Improves Chain of Thought Reasoning in Language Models},
  author    = {Wang, Xuezhi and Wei, Jason and Schuurmans, Dale and Le, Quoc and Chi, Ed and
               Narang, Sharan and Chowdhery, Aakanksha and Zhou, Denny},
  booktitle = {ICLR},
  year      = {2023}
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ConsAtN(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Sequence(datasets.Value("string")),
                                        "references": datasets.Value("string")}),
            reference_urls=["https://arxiv.org/abs/2203.11171"])

    def _compute(self, predictions, references, answer_format=None):
        return {"cons_at_n": cons_at_n(predictions, references, answer_format)}
