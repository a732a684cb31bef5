"""The library's version (one place: the package, the tuning cache and reports read it here)."""

__version__ = "0.1.0"
