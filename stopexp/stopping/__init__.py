"""The stopping methods, which read only answers and confidences (ESC, Adaptive-Consistency,
DeepConf, Parallel-Probe, the combined controller): one registered class each with its
settings and source (`method.StoppingMethod`), replayed on a trace bank (`replay`) or an
answers-only bank (`branch_draws`); numpy only, no LM."""
