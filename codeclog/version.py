"""The version of codeclog (also written into captures)."""

__version__ = "0.1.0"
