"""Signal predictors: small models that score a path checkpoint from the LM's internal
state (or, for the controls, from non-learnable signals). See features.py for the batch."""
from __future__ import annotations

from stopexp.core.names import lookup, names
from stopexp.signals.base import Predictor
from stopexp.signals.features import SIGNAL_NAMES, FeatureSpec

# the predictors of a feature batch, by name (registered in stopexp.core.names)
PREDICTORS = {name: lookup("predictor", name) for name in names("predictor")}

__all__ = ["PREDICTORS", "SIGNAL_NAMES", "FeatureSpec", "Predictor", "build_predictor"]


def build_predictor(pred_cfg, spec: FeatureSpec) -> Predictor:
    """The predictor `pred_cfg.name` (a PredictorConfig or its DictConfig) for features
    shaped by `spec`. Seed torch beforehand for reproducible initial weights."""
    if pred_cfg.name not in PREDICTORS:
        raise ValueError(f"predictor.name: {pred_cfg.name!r} has no predictor here; "
                         f"available: {', '.join(PREDICTORS)}")
    if pred_cfg.hidden < 1 or pred_cfg.depth < 0 or not 0 <= pred_cfg.dropout < 1:
        raise ValueError("predictor.hidden must be >= 1, predictor.depth >= 0 and "
                         f"predictor.dropout in [0, 1); got hidden={pred_cfg.hidden}, "
                         f"depth={pred_cfg.depth}, dropout={pred_cfg.dropout}")
    return PREDICTORS[pred_cfg.name](pred_cfg, spec)
