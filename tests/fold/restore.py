"""What a restarted member does to a fold state, for the tests that check it changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterable

from codeclog.consumers.stream.fold.state import FoldState, export_request, import_request


def restore(original: FoldState, request_ids: Iterable[str], into: FoldState) -> FoldState:
    """`into` with every request of `request_ids` that `original` knows exported, through JSON
    (as a checkpoint carries it), and imported in that order."""
    for rid in request_ids:
        exported = export_request(original, rid)
        if exported is not None:
            import_request(into, rid, json.loads(json.dumps(exported)))
    return into
