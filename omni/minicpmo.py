"""MiniCPM-o talker -> Code2Wav payloads as codeclog's typed records (`CodecChunk`, `ControlEvent`
FINISH) and back. Reasons: docs/vllm-omni.md, "Mode 1"; docs/wire-format.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from codeclog.omni.tree import (
    Backing,
    Path,
    PayloadError,
    Resolver,
    array_from,
    is_tensor,
    same,
    tensor_bytes,
    tensor_from,
)
from codeclog.schemas.records import (
    CodecChunk,
    ControlEvent,
    ControlKind,
    PayloadEntry,
    PayloadKind,
)

# CodecChunk field -> where the upstream payload keeps it
CHUNK_PATHS: dict[str, Path] = {
    "codes": ("codes", "audio"),
    "ref_audio": ("codes", "ref"),
    "request_id": ("meta", "request_id"),
    **{
        name: ("meta", name)
        for name in (
            "cache_epoch",
            "chunk_seq",
            "code_flat_numel",
            "codec_chunk_frames",
            "codec_left_context_frames",
            "last_chunk",
            "tts_is_last_chunk",
            "turn_end",
            "duplex_epoch",
            "duplex_turn_id",
            "llm_output_text_utf8",
            "segment_end",
            "ref_audio_sr",
            "prompt_cache_id",
            "streaming_condition_seq",
        )
    },
}
_BY_PATH = {path: field for field, path in CHUNK_PATHS.items()}
_POSITION_KEYS = ("cache_epoch", "chunk_seq", "code_flat_numel", "last_chunk")
_BOOL_FIELDS = {"last_chunk", "tts_is_last_chunk", "turn_end", "segment_end"}
_STR_FIELDS = {"request_id", "prompt_cache_id"}
_BYTES_FIELDS = {"llm_output_text_utf8", "ref_audio"}
END_MARKER_REASON = "vllm-omni end marker"
BOUNDARY_REASON = "vllm-omni control-only boundary"


def _get(payload: Any, path: Path) -> tuple[bool, Any]:
    node: Any = payload
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False, None
        node = node[key]
    return True, node


def has_codes(payload: Any) -> bool:
    """The payload carries a codec window (`codes.audio`)."""
    found, value = _get(payload, CHUNK_PATHS["codes"])
    return found and value is not None


def is_codec_payload(payload: Any) -> bool:
    """Recognisably MiniCPM-o's without knowing the edge: `codes.audio` and a stream position
    in `meta`."""
    meta = payload.get("meta") if isinstance(payload, Mapping) else None
    return (
        has_codes(payload)
        and isinstance(meta, Mapping)
        and any(key in meta for key in _POSITION_KEYS)
    )


def _truthy(value: Any) -> bool:
    if is_tensor(value):
        return bool(value.numel() == 1 and bool(value.reshape(-1)[0]))
    return value is True


def is_finished(payload: Any) -> bool:
    """`meta.finished` is true: the adapter's mark of the request's last payload."""
    return _truthy(_get(payload, ("meta", "finished"))[1])


# ---------------------------------------------------------------------------------------------
# payload -> records


def _field_value(name: str, value: Any) -> tuple[bool, Any]:
    """The CodecChunk value of a payload leaf, if it has one."""
    if is_tensor(value):
        dtype = str(value.dtype).removeprefix("torch.")
        if name in _BYTES_FIELDS:
            wanted = "float32" if name == "ref_audio" else "uint8"
            if dtype != wanted or value.dim() != 1:
                return False, None
            return True, tensor_bytes(value)[2]
        if dtype == "bfloat16" or value.is_floating_point() or value.is_complex():
            return False, None
        items = [int(v) for v in value.detach().to("cpu").reshape(-1).tolist()]
        if name == "codes":
            return True, tuple(items)
        if len(items) != 1:
            return False, None
        if name in _BOOL_FIELDS:
            return (dtype == "bool"), bool(items[0])
        return (dtype != "bool"), items[0]
    if name == "codes":
        if type(value) in (list, tuple) and all(type(v) is int for v in value):
            return True, tuple(value)
        return False, None
    if name in _BOOL_FIELDS:
        return type(value) is bool, value
    if name in _STR_FIELDS:
        return type(value) is str, value
    if name in _BYTES_FIELDS:
        return type(value) is bytes and name != "ref_audio", value
    return type(value) is int, value


def codec_record(
    payload: Mapping[str, Any], request_id: str, now_ms: int, producer_id: str
) -> tuple[CodecChunk, Backing]:
    """The chunk of a payload with `codes.audio`, and which payload nodes it carries. A field
    the payload lacks takes the record's default, which is the default the upstream Code2Wav
    substitutes for a missing producer field, so a payload that lost its metadata on the way
    (the seed incident) is on the log as the upstream would have read it."""
    fields: dict[str, Any] = {}
    for name, path in CHUNK_PATHS.items():
        found, value = _get(payload, path)
        if found:
            ok, converted = _field_value(name, value)
            if ok:
                fields[name] = converted
    fields.setdefault("request_id", request_id)
    fields.setdefault("codes", ())
    chunk = CodecChunk(produced_at_ms=now_ms, producer_id=producer_id, **fields)
    resolve = chunk_resolver(chunk)

    def backed(path: Path, value: Any) -> PayloadEntry | None:
        name = _BY_PATH.get(path)
        if name is None or name not in fields:
            return None
        entry = _reference(path, name, value)
        try:
            if entry is not None and same(value, resolve(entry)):
                return entry
        except PayloadError:
            pass
        return None

    return chunk, backed


def _reference(path: Path, name: str, value: Any) -> PayloadEntry | None:
    source = f"codec_chunk.{name}"
    if is_tensor(value):
        shape = tuple(int(n) for n in value.shape)
        dtype = str(value.dtype).removeprefix("torch.")
        return PayloadEntry(path, PayloadKind.TENSOR, dtype=dtype, shape=shape, source=source)
    kinds = {bool: PayloadKind.BOOL, int: PayloadKind.INT, str: PayloadKind.STR}
    kinds.update({bytes: PayloadKind.BYTES, list: PayloadKind.LIST, tuple: PayloadKind.TUPLE})
    kind = kinds.get(type(value))
    return None if kind is None else PayloadEntry(path, kind, source=source)


def end_marker(payload: Any, request_id: str, now_ms: int, producer_id: str) -> ControlEvent:
    """The FINISH control event of a payload without codes on the codec edge: a control-only
    boundary, the adapter's own end marker (`meta.finished` only, sent when the processor
    returns None on a request's last step) or MiniCPM-o's duplex boundary after a turn's
    terminal chunk. It flushes what the fold holds of the request and releases it, and is
    harmless when no stream is open, which is always the case for the duplex boundary (the
    terminal chunk before it closed the epoch)."""
    reason = END_MARKER_REASON if is_finished(payload) else BOUNDARY_REASON
    return ControlEvent(request_id, ControlKind.FINISH, reason, now_ms, producer_id)


# ---------------------------------------------------------------------------------------------
# records -> payload values


def chunk_resolver(chunk: CodecChunk) -> Resolver:
    """The value of a node that `chunk` carries (`source` "codec_chunk.<field>")."""

    def resolve(entry: PayloadEntry) -> Any:
        name = (entry.source or "").removeprefix("codec_chunk.")
        if name not in CHUNK_PATHS:
            raise PayloadError(f"{'.'.join(entry.path)}: no chunk field {entry.source!r}")
        return _node_value(entry, getattr(chunk, name), name)

    return resolve


def _node_value(entry: PayloadEntry, value: Any, name: str) -> Any:
    kind = entry.kind
    if kind is PayloadKind.LIST:
        return list(value)
    if kind is PayloadKind.TUPLE:
        return tuple(value)
    if kind in (PayloadKind.TENSOR, PayloadKind.NDARRAY):
        if entry.dtype is None:
            raise PayloadError(f"{'.'.join(entry.path)}: array node without a dtype")
        if isinstance(value, bytes):
            data = value
        else:
            items = list(value) if isinstance(value, tuple) else [value]
            data = np.asarray(items, dtype=_numpy_name(entry.dtype)).tobytes()
        if kind is PayloadKind.TENSOR:
            return tensor_from(entry.dtype, entry.shape, data)
        return array_from(entry.dtype, entry.shape, data)
    if value is None:
        raise PayloadError(f"{'.'.join(entry.path)}: chunk field {name} is null")
    return value


def _numpy_name(dtype: str) -> str:
    if dtype == "bfloat16":
        raise PayloadError("a bfloat16 tensor cannot be carried by a CodecChunk field")
    return dtype


def minicpmo_payload(chunk: CodecChunk, *, finished: bool = False) -> dict[str, Any]:
    """The payload the upstream producer returns for `chunk` (torch tensors where it has them).

    For tests and tools: what `tts2code2wav_async_chunk` hands the adapter, after the adapter set
    `finished` and `is_segment_finished`.
    """
    import torch

    codes: dict[str, Any] = {"audio": torch.tensor(list(chunk.codes), dtype=torch.int64)}
    meta: dict[str, Any] = {
        "request_id": chunk.request_id,
        "req_id": [chunk.request_id],
        "chunk_seq": chunk.chunk_seq,
        "cache_epoch": chunk.cache_epoch,
        "code_flat_numel": chunk.frames,
        "codec_chunk_frames": chunk.codec_chunk_frames,
        "codec_left_context_frames": chunk.codec_left_context_frames,
        "left_context_size": chunk.codec_left_context_frames,
        "last_chunk": chunk.last_chunk,
        "stream_finished": torch.tensor(chunk.last_chunk),
        "finished": torch.tensor(finished),
        "is_segment_finished": torch.tensor(chunk.tts_is_last_chunk or chunk.last_chunk),
        "tts_is_last_chunk": chunk.tts_is_last_chunk,
        "turn_end": chunk.turn_end,
        "duplex_epoch": chunk.duplex_epoch,
        "duplex_turn_id": chunk.duplex_turn_id,
        "llm_output_text_utf8": torch.tensor(list(chunk.llm_output_text_utf8), dtype=torch.uint8),
        "replace_runtime_additional_information": True,
    }
    if chunk.ref_audio is not None:
        codes["ref"] = tensor_from("float32", (len(chunk.ref_audio) // 4,), chunk.ref_audio)
        meta["ref_audio_sr"] = chunk.ref_audio_sr
    return {"codes": codes, "meta": meta}
