"""Control events: `finish` decodes what is held and releases the stream, `abort` drops it."""

from __future__ import annotations

from codeclog.consumers.stream.fold.outcomes import Outcome, Reject, RejectReason
from codeclog.consumers.stream.fold.release import end_stream, flush_held
from codeclog.consumers.stream.fold.state import NO_POSITION, FoldState
from codeclog.consumers.stream.fold.strict import die
from codeclog.schemas.records import ControlEvent, ControlKind


def control(state: FoldState, event: ControlEvent) -> list[Outcome]:
    rid = event.request_id
    if not rid:
        reject = Reject(rid, RejectReason.MISSING_REQUEST_ID, NO_POSITION, NO_POSITION)
        return die(state, reject) if state.strict else [reject]
    req = state.open.get(rid)
    if req is None:  # nothing open: a repeated or late control event is a no-op
        return []
    if event.kind is ControlKind.FINISH:
        out: list[Outcome] = [flush_held(req, rid, None)] if req.held_codes else []
        out.append(end_stream(state, req, rid, RejectReason.CHUNK_AFTER_FINAL))
        return out
    if event.kind is ControlKind.ABORT:
        return [end_stream(state, req, rid, RejectReason.ABORTED)]
    return []
