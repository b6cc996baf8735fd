"""stopexp's version, one place: the package's `__version__` and what a bank's meta.json
records of the hf engine that made it (stopexp.search.decode.Engine.record)."""

__version__ = "0.1.0"
