"""Keys added to the predictor and train sections after predictors were trained and saved,
each with the value those were trained at. The predictor's key leaves them out at that
value (stopexp.store.keys.predictor_key), and a checkpoint that records none of them was
trained at it (stopexp.signals.saved_predictor.check_saved_predictor), so no predictor saved
before they existed is retrained or refused."""
from __future__ import annotations

PREDICTOR_KEYS_ADDED = {"centre_prompts": False, "pca_components": None, "lora_dropout": 0.0}
TRAIN_KEYS_ADDED = {"max_prompts": None, "early_stopping": True, "accumulate": 1, "mixed_only": False}
LOSS_KEYS_ADDED = {"labels": "mc"}
