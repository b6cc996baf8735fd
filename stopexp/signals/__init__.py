"""Signal predictors: small models that score a path checkpoint from the LM's internal
state (or, for the controls, from non-learnable signals). See features.py for the batch."""
from __future__ import annotations

from stopexp.core.names import lookup
from stopexp.signals.base import Predictor
from stopexp.signals.feature_spec import SIGNAL_NAMES, FeatureSpec

__all__ = ["SIGNAL_NAMES", "FeatureSpec", "Predictor", "build_predictor"]


def build_predictor(pred_cfg, spec: FeatureSpec) -> Predictor:
    """The predictor `pred_cfg.name` (a PredictorConfig or its DictConfig), registered as a
    predictor of a feature batch (stopexp.core.names), for features shaped by `spec`. Seed
    torch beforehand for reproducible initial weights."""
    cls = lookup("predictor", pred_cfg.name)  # unknown: one line listing the registered ones
    if pred_cfg.hidden < 1 or pred_cfg.depth < 0 or not 0 <= pred_cfg.dropout < 1:
        raise ValueError("predictor.hidden must be >= 1, predictor.depth >= 0 and "
                         f"predictor.dropout in [0, 1); got hidden={pred_cfg.hidden}, "
                         f"depth={pred_cfg.depth}, dropout={pred_cfg.dropout}")
    return cls(pred_cfg, spec)
