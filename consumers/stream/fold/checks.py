"""Checks shared by both policies (S1/T1, S2/T2, S2a/T2a), and a chunk's digest."""

from __future__ import annotations

from codeclog.consumers.stream.fold.outcomes import Details, Reject, RejectReason, details_of
from codeclog.schemas.records import CodecChunk, first_invalid_code


def chunk_window(chunk: CodecChunk) -> tuple[int, ...] | None:
    """`codes[:code_flat_numel]` (numel defaults to len(codes)); None when numel is out of range."""
    codes = chunk.codes
    numel = chunk.code_flat_numel
    if numel is None or numel == len(codes):
        return codes  # the common case: no copy
    if 0 <= numel < len(codes):
        return codes[:numel]
    return None


def content_problem(chunk: CodecChunk, window: tuple[int, ...] | None) -> Reject | None:
    """T2a/S2a: the real ids must exist and be codec ids; checked before any state is read."""
    if window is None:
        detail = details_of(code_flat_numel=chunk.code_flat_numel, codes=len(chunk.codes))
        return reject_chunk(chunk, RejectReason.INVALID_FRAME_COUNT, detail)
    index = first_invalid_code(window)
    if index is None:
        return None
    detail = details_of(index=index, code=window[index])
    return reject_chunk(chunk, RejectReason.INVALID_CODES, detail)


def reject_chunk(chunk: CodecChunk, reason: RejectReason, details: Details = ()) -> Reject:
    return Reject(chunk.request_id, reason, chunk.cache_epoch, chunk.chunk_seq, details)


def chunk_digest(chunk: CodecChunk, window: tuple[int, ...]) -> int:
    """Equal digests mean a true replay. Only ints and bools: hash() is stable across runs."""
    return hash((window, len(window), chunk.last_chunk, chunk.tts_is_last_chunk))
