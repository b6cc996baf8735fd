"""Within-prompt AUROC as an `evaluate` module (stopexp.metrics.ranking.within_prompt_auroc)."""
import datasets
import evaluate

from stopexp.metrics.ranking import within_prompt_auroc

_DESCRIPTION = """Within-prompt AUROC: the area under the ROC curve of a score that should rank a
prompt's good paths (label 1) above its doomed ones (label 0), computed for each prompt
(group) that has both outcomes and averaged over those prompts. Pruning only ever chooses
among the paths of one prompt; a pooled AUROC would also reward knowing which prompts are
hard. Ties count one half (midranks); NaN scores rank lowest, +-inf at the extremes. NaN
when no prompt has both outcomes."""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `float`): one score per path, higher = more likely correct.
    references (`list` of `int`): the path's outcome, 1 correct, 0 wrong.
    groups (`list` of `int` or `str`): the prompt each path belongs to.
Returns:
    within_prompt_auroc (`float`): the mean AUROC over prompts with both outcomes.
Examples:
    >>> auroc = evaluate.load(stopexp.metrics.evaluate_module("within_prompt_auroc"))
    >>> auroc.compute(predictions=[0.9, 0.1, 0.4, 0.2, 0.3], references=[1, 0, 1, 0, 1],
    ...               groups=[0, 0, 0, 1, 1])
    {'within_prompt_auroc': 1.0}
"""

_CITATION = """@article{stop2026,
  title   = {Cut Your Losses!},
  journal = {arXiv preprint arXiv:2604.16029},
  year    = {2026}
}"""


def _features(group_type: str) -> datasets.Features:
    return datasets.Features({"predictions": datasets.Value("float64"),
                              "references": datasets.Value("int64"),
                              "groups": datasets.Value(group_type)})


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class WithinPromptAuroc(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(description=_DESCRIPTION, citation=_CITATION,
                                   inputs_description=_KWARGS_DESCRIPTION,
                                   features=[_features("int64"), _features("string")],
                                   reference_urls=["https://arxiv.org/abs/2604.16029"])

    def _compute(self, predictions, references, groups):
        return {"within_prompt_auroc": within_prompt_auroc(predictions, references, groups)}
