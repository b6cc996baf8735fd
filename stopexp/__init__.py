"""stopexp: learned internal signals that prune doomed reasoning paths early."""

from stopexp.core.version import __version__

__all__ = ["__version__"]
