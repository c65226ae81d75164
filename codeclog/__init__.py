"""codeclog: an event-sourced Kafka pipeline from a speech talker to the Token2wav vocoder."""

from codeclog.version import __version__

__all__ = ["__version__"]
