"""Numpy stopping rules that read only answers and confidences (ESC, Adaptive-Consistency,
Parallel-Probe, DeepConf) and their replay on a bank; no LM."""
