"""Export and import of one request's fold state (plain JSON-able dicts)."""

from __future__ import annotations

import dataclasses
import itertools
from array import array
from typing import Any

from codeclog.consumers.stream.fold.outcomes import Echo, RejectReason
from codeclog.consumers.stream.fold.state import (
    Digests,
    FoldError,
    FoldState,
    RequestState,
    Tombstone,
)
from codeclog.json_values import json_bool, json_int

EXPORT_VERSION = 1


class FoldStateError(FoldError):
    """An exported request state cannot be imported (malformed or inconsistent)."""


def export_request(state: FoldState, request_id: str) -> dict[str, Any] | None:
    """One request's fold state as a JSON-able dict, or None when the fold knows nothing of it."""
    req = state.open.get(request_id) or state.closed.get(request_id)
    if req is None:
        return None
    return {
        "version": EXPORT_VERSION,
        "epoch": req.epoch,
        "open": req.is_open,
        "last_seq": req.last_seq,
        "held_codes": list(req.held_codes),
        "held_seqs": list(req.held_seqs),
        "held_echo": None if req.held_echo is None else _export_echo(req.held_echo),
        "digests": _export_digests(req.digests),
        "released": [
            {"epoch": epoch, "last_seq": t.last_seq, "end": t.end.value}
            | {"digests": _export_digests(t.digests)}
            for epoch, t in req.released.items()
        ],
    }


def _export_digests(digests: Digests) -> dict[str, Any]:
    return {
        "seqs": list(digests.seqs),
        "values": list(digests.values),
        "forgotten_below": digests.forgotten_below,
    }


def _export_echo(echo: Echo) -> dict[str, Any]:
    fields = dataclasses.asdict(echo)
    fields["llm_output_text_utf8"] = echo.llm_output_text_utf8.hex()
    return fields


def import_request(state: FoldState, request_id: str, data: dict[str, Any]) -> None:
    """Replace a request's fold state with an `export_request` dict. Raises FoldStateError."""
    if not request_id:
        raise FoldStateError("cannot import a request state without a request id")
    try:
        req = _import(data)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise FoldStateError(f"malformed state for request {request_id!r}: {exc}") from exc
    state.open.pop(request_id, None)
    state.closed.pop(request_id, None)
    if req.is_open:
        state.open[request_id] = req
        return
    state.closed[request_id] = req
    if len(state.closed) > state.config.tombstone_requests:
        state.closed.popitem(last=False)


def _import(data: dict[str, Any]) -> RequestState:
    if data.get("version") != EXPORT_VERSION:
        raise ValueError(f"unknown version {data.get('version')!r}")
    req = RequestState(
        epoch=json_int(data["epoch"]),
        is_open=json_bool(data["open"]),
        last_seq=json_int(data["last_seq"]),
        held_codes=[json_int(code) for code in data["held_codes"]],
        held_seqs=[json_int(seq) for seq in data["held_seqs"]],
        held_echo=None if data["held_echo"] is None else _import_echo(data["held_echo"]),
        digests=_import_digests(data["digests"]),
    )
    for item in data["released"]:
        end = RejectReason(item["end"])
        tombstone = Tombstone(json_int(item["last_seq"]), _import_digests(item["digests"]), end)
        req.released[json_int(item["epoch"])] = tombstone
    _check_consistent(req)
    return req


def _check_consistent(req: RequestState) -> None:
    if not req.is_open and req.epoch >= 0 and req.epoch not in req.released:
        raise ValueError("a closed request must have a tombstone for its current epoch")
    if bool(req.held_codes) != bool(req.held_seqs) or (req.held_codes and not req.is_open):
        raise ValueError("held frames need held chunk seqs and an open stream")
    if any(epoch > req.epoch for epoch in req.released):
        raise ValueError("a released epoch is newer than the current epoch")


def _import_digests(data: dict[str, Any]) -> Digests:
    seqs = array("i", [json_int(seq) for seq in data["seqs"]])
    values = array("q", [json_int(value) for value in data["values"]])
    if len(seqs) != len(values) or any(a >= b for a, b in itertools.pairwise(seqs)):
        raise ValueError("digest seqs must be strictly increasing and match the values")
    return Digests(seqs, values, json_int(data["forgotten_below"]))


def _import_echo(data: dict[str, Any]) -> Echo:
    return Echo(
        duplex_epoch=json_int(data["duplex_epoch"]),
        duplex_turn_id=json_int(data["duplex_turn_id"]),
        turn_end=json_bool(data["turn_end"]),
        tts_is_last_chunk=json_bool(data["tts_is_last_chunk"]),
        segment_end=json_bool(data["segment_end"]),
        llm_output_text_utf8=bytes.fromhex(data["llm_output_text_utf8"]),
        produced_at_ms=json_int(data["produced_at_ms"]),
    )
