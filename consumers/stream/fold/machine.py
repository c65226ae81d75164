"""The fold: per-request codec-stream state, `fold(state, event) -> (state, outcomes)`.

The rules (S* strict, T* tolerant, A* apply, control events) are in docs/fold-contract.md; this
module dispatches an event to them: strict.py (S*), tolerant.py (T*, A*), control.py, and cap.py
(the open-stream cap C1a, and `evict`); the state is in state.py, its export and import in
state_io.py. Each branch names the rule it implements. No I/O, clock, randomness, torch, Kafka or
Avro.

Performance contract: `fold` mutates `state` in place and returns the same object, so a caller
must not keep an older reference expecting it to be a snapshot (use `export_request` for that).
Only the event's own request record is touched (at the LRU bound below, the least recently
used tombstone is also dropped).

Memory, measured with tracemalloc (CPython 3.11, 64-bit; tests/fold/test_fold_memory.py keeps
it honest), not counting the request id string the state keeps as a key:
- tolerant, open request: about 560 bytes + 12 bytes per applied chunk, the digests of at most
  `digest_ring` (256) chunks: 0.9 KB for a 30-chunk turn, at most about 3.7 KB, whatever the
  stream's length;
- tolerant, request without an open stream: about 450 bytes + one tombstone per released epoch
  it keeps (`released_epochs_kept`, 2): 1.2 KB after one 30-chunk epoch, 1.9 KB after several,
  at most about 7.5 KB (two 256-chunk tombstones). These requests live in an LRU of
  `tombstone_requests` (100_000): about 0.12 GB for 100_000 one-turn requests, 0.75 GB worst;
- strict: about 300 bytes per open request, nothing after release.
Bound the number of open requests in the caller (`open_requests`, `evict`).
"""

from __future__ import annotations

from codeclog.consumers.stream.fold.cap import evict_least_active, mark_active
from codeclog.consumers.stream.fold.control import control
from codeclog.consumers.stream.fold.outcomes import Outcome
from codeclog.consumers.stream.fold.state import FoldState
from codeclog.consumers.stream.fold.strict import strict_chunk
from codeclog.consumers.stream.fold.tolerant import tolerant_chunk
from codeclog.schemas.records import CodecChunk, ControlEvent

Event = CodecChunk | ControlEvent


def fold(state: FoldState, event: Event) -> tuple[FoldState, list[Outcome]]:
    """Apply one event. Returns the same (mutated) state object and the event's outcomes."""
    if state.fatal is not None:
        state.unprocessed += 1
        return state, []
    state.events += 1
    if state.max_open is None:
        return state, _dispatch(state, event)
    opened = len(state.open)
    mark_active(state, event.request_id)
    outcomes = _dispatch(state, event)
    if len(state.open) > opened:  # C1a: a stream opened; evict beyond the cap
        evict_least_active(state, event.request_id, outcomes)
    return state, outcomes


def _dispatch(state: FoldState, event: Event) -> list[Outcome]:
    if type(event) is CodecChunk:
        if state.strict:
            return strict_chunk(state, event)
        return tolerant_chunk(state, event)
    if type(event) is ControlEvent:
        return control(state, event)
    raise TypeError(f"fold takes CodecChunk or ControlEvent, got {type(event).__name__}")
