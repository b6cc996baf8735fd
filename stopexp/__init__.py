"""stopexp: learned internal signals that prune doomed reasoning paths early."""

__version__ = "0.1.0"
