"""pass@1 as an `evaluate` module (stopexp.metrics.vote_accuracy.pass_at_1)."""
import datasets
import evaluate

from stopexp.metrics.vote_accuracy import pass_at_1

_DESCRIPTION = """pass@1 estimated from N sampled paths per prompt: the chance that one sampled
path is right, i.e. the mean over prompts of the share of its N paths that are correct (the
unbiased estimator of Chen et al. 2021 at k = 1, as DeepSeek-R1 reports it). It is avg@N of
the unpruned paths."""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `int`): per prompt, the 0/1 correctness of every sampled path.
Returns:
    pass_at_1 (`float`): in [0, 1].
Examples:
    >>> p1 = evaluate.load(stopexp.metrics.evaluate_module("pass_at_1"))
    >>> p1.compute(predictions=[[1, 0, 0, 0], [1, 1]])
    {'pass_at_1': 0.625}
"""

_CITATION = """@article{chen2021codex,
  title   = {Evaluating Large Language Models Trained on Code},
  author  = {Chen, Mark and others},
  journal = {arXiv preprint arXiv:2107.03374},
  year    = {2021}
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class PassAt_1(evaluate.Metric):  # evaluate names the module after the class: pass_at_1
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Sequence(datasets.Value("int64"))}),
            reference_urls=["https://arxiv.org/abs/2107.03374"])

    def _compute(self, predictions):
        return {"pass_at_1": pass_at_1(predictions)}
