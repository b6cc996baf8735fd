"""A tiny `evaluate` module for the tests of reward=evaluate: the share of the reference's
words that the prediction contains, per prediction (`per_path`) and averaged (`word_recall`)."""
import datasets
import evaluate


class WordRecall(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="share of the reference's distinct words found in the prediction",
            citation="", inputs_description="predictions: list of str; references: list of str",
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Value("string")}))

    def _compute(self, predictions, references):
        per_path = [len(set(p.split()) & set(r.split())) / len(set(r.split()))
                    for p, r in zip(predictions, references)]
        return {"word_recall": sum(per_path) / len(per_path), "per_path": per_path}
