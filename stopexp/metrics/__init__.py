"""Metrics: ranking (within-prompt AUROC first), calibration, voting and text similarity;
the field's metrics as `evaluate` modules (`evaluate_module`)."""
from stopexp.metrics.calibration import brier, ece, reliability
from stopexp.metrics.evaluate_modules import evaluate_module
from stopexp.metrics.ranking import (auprc, auroc, bootstrap_ci, bootstrap_over_groups, is_binary,
                                     length_correlation, nonfinite, paired_difference, per_group_auroc,
                                     pooled_auroc, reward_ranking, within_prompt_auroc)
from stopexp.metrics.text_similarity import BertScorer, bleu, rouge, text_metrics
from stopexp.metrics.vote_accuracy import avg_at_k, cons_at_n, majority_vote, pass_at_1

__all__ = ["auroc", "auprc", "pooled_auroc", "within_prompt_auroc", "per_group_auroc",
           "bootstrap_ci", "bootstrap_over_groups", "paired_difference",
           "length_correlation", "nonfinite",
           "reward_ranking", "is_binary",
           "ece", "brier", "reliability",
           "majority_vote", "cons_at_n", "avg_at_k", "pass_at_1",
           "bleu", "rouge", "BertScorer", "text_metrics", "evaluate_module"]
