"""Training the predictor on a frozen LM's features: losses, per-step data and online
adaptation."""
