"""What a fold state holds in memory, estimated from its contents: `state_bytes`.

The per-item costs are the ones measured with tracemalloc (CPython 3.11, 64-bit;
docs/fold-contract.md, "Memory per request", states them and tests/fold/test_fold_memory.py
keeps them honest): an open request about 545
bytes plus 12.5 per digest in its ring, a request without an open stream about 460 bytes plus
345 per tombstone and 12.5 per digest it keeps, a held frame (code and seq) about 72 bytes, and
the request id the state keeps as a key; under the strict policy an open request about 300
bytes and nothing once released. It walks every request once: the member reads it at
most every few seconds (consumers.member.service), never per record.
"""

from __future__ import annotations

from codeclog.consumers.stream.fold.state import FoldState, RequestState

OPEN_BYTES = 545
STRICT_OPEN_BYTES = 300  # strict keeps no digests, and nothing once released
CLOSED_BYTES = 460
TOMBSTONE_BYTES = 345
DIGEST_BYTES = 12.5
HELD_FRAME_BYTES = 72
KEY_BYTES = 49  # a str object's size before its characters (ASCII)


def request_bytes(request_id: str, req: RequestState, strict: bool = False) -> int:
    """The estimated bytes one request's state holds (its key included)."""
    size = KEY_BYTES + len(request_id)
    if strict:
        size += STRICT_OPEN_BYTES
    else:
        size += OPEN_BYTES if req.is_open else CLOSED_BYTES
    digests = len(req.digests.seqs) + sum(len(t.digests.seqs) for t in req.released.values())
    size += len(req.released) * TOMBSTONE_BYTES + len(req.held_codes) * HELD_FRAME_BYTES
    return size + round(digests * DIGEST_BYTES)


def state_bytes(state: FoldState) -> int:
    """The estimated bytes of every request a fold state remembers, open or not."""
    total = sum(request_bytes(rid, req, state.strict) for rid, req in state.open.items())
    return total + sum(request_bytes(rid, req) for rid, req in state.closed.items())


def remembered_requests(state: FoldState) -> int:
    """Requests the state remembers: with an open stream, or as tombstones."""
    return len(state.open) + len(state.closed)
