"""Evaluate's accounting: methods' scores, decisions, accuracy, tokens, memory, analyses,
tables and plots, and the online and beam runs they measure."""
