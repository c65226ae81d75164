"""Talker side: upstream-compatible windowing, the durable publisher, the synthetic talker."""
