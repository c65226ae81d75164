"""A step's decode windows in rounds: what one `decode_batch` call decodes together."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from codeclog.consumers.stream.fold.outcomes import Decode, Outcome
from codeclog.kafka.records import InputRecord


@dataclasses.dataclass(slots=True)
class Window:
    """A decode window waiting for its round, with the record that completed it."""

    decode: Decode
    record: InputRecord | None


Pending = dict[str, list[Window | Outcome]]  # request id -> its windows and epoch ends


def next_round(
    pending: Pending, max_batch: int, end_epoch: Callable[[str, Outcome], None]
) -> list[Window]:
    """Take the next round off `pending`: each request's next window, `max_batch` at most. The
    epoch ends queued before a request's window go to `end_epoch` first; a request whose queue
    is empty leaves `pending`. `pending` holds, per request in fold order, its decode windows
    (with the record that completed each) and the outcomes that end its epoch (Release,
    Abandoned): one window per request per round, since a request's windows depend on each other
    through its vocoder state, so one call serves every request with a window in the step, and
    an epoch's end is acted on when its request's queue reaches it, after the windows before
    it."""
    batch: list[Window] = []
    for rid in list(pending):
        queue = pending[rid]
        while queue and not isinstance(queue[0], Window):
            ended = queue.pop(0)
            assert not isinstance(ended, Window)
            end_epoch(rid, ended)
        if queue and len(batch) < max_batch:
            window = queue.pop(0)
            assert isinstance(window, Window)
            batch.append(window)
        if not queue:
            del pending[rid]
    return batch
