"""Capture streams from the log and replay them offline, deterministically.
Its modules and reasons: docs/replay.md."""
