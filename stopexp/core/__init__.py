"""What every layer shares and that imports nothing else of stopexp: errors, names, the
protocol's arithmetic, threshold policies and voting rules."""
