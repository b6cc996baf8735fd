"""avg@k as an `evaluate` module (stopexp.metrics.vote_accuracy.avg_at_k)."""
import datasets
import evaluate

from stopexp.metrics.vote_accuracy import avg_at_k

_DESCRIPTION = """avg@k (avg@k|N after pruning N sampled paths to k): for each prompt, the mean
correctness of the paths kept for it; then the mean over prompts. A prompt left with no
path gives no answer and counts as 0. Over all N unpruned paths it is pass@1 as DeepSeek-R1
reports it (the mean over k samples); random pruning must leave it unchanged in expectation."""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `int`): per prompt, the 0/1 correctness of each kept path
        (an empty list: the prompt kept none).
Returns:
    avg_at_k (`float`): in [0, 1].
Examples:
    >>> avg = evaluate.load(stopexp.metrics.evaluate_module("avg_at_k"))
    >>> avg.compute(predictions=[[1, 0, 1, 1], [0, 0], []])
    {'avg_at_k': 0.25}
"""

_CITATION = """@article{deepseekr1,
  title   = {DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via Reinforcement Learning},
  author  = {{DeepSeek-AI}},
  journal = {arXiv preprint arXiv:2501.12948},
  year    = {2025}
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AvgAtK(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Sequence(datasets.Value("int64"))}),
            reference_urls=["https://arxiv.org/abs/2501.12948"])

    def _compute(self, predictions):
        return {"avg_at_k": avg_at_k(predictions)}
