"""codeclog: an event-sourced Kafka pipeline from a speech talker to the Token2wav vocoder."""

__version__ = "0.1.0"
