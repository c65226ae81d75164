"""The canonical window schedule of a token stream, MiniCPM-o's 25 + 3 buffering rule
(docs/vocoder.md, "Windows and sample counts")."""

from __future__ import annotations

from collections.abc import Sequence

CHUNK_TOKENS = 25  # fresh ids per window: 1 s of audio
LOOKAHEAD_TOKENS = 3  # right context at the end of each window, sent again in the next one


def canonical_windows(
    tokens: Sequence[int],
    chunk_tokens: int = CHUNK_TOKENS,
    lookahead: int = LOOKAHEAD_TOKENS,
) -> list[tuple[tuple[int, ...], bool]]:
    """(window ids, last_chunk) pairs for a complete stream.

    While at least chunk + lookahead ids remain, emit them and advance by `chunk_tokens` (so
    consecutive windows overlap by `lookahead`); the rest is the final window (maybe empty).
    """
    if chunk_tokens < 1 or lookahead < 0:
        raise ValueError("chunk_tokens must be >= 1 and lookahead >= 0")
    windows: list[tuple[tuple[int, ...], bool]] = []
    start = 0
    while len(tokens) - start >= chunk_tokens + lookahead:
        windows.append((tuple(tokens[start : start + chunk_tokens + lookahead]), False))
        start += chunk_tokens
    windows.append((tuple(tokens[start:]), True))
    return windows
