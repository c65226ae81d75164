"""Capture streams from the log and replay them offline, deterministically."""
