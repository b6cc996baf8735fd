"""What every layer shares and that imports nothing else of stopexp: errors, names (and the
registries of external scorers and rewards), the protocol's arithmetic, config text
(escapes, stop strings), threshold policies, voting rules and the version."""
