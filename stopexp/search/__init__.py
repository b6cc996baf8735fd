"""Decoding and search: the engine, plain sampling, tracing, pruned searches."""
