"""vllm-omni stage payloads <-> codeclog records, shape for shape.

A payload (what a stage input processor returns and an OmniConnector moves) is a tree of dicts,
lists and tuples whose leaves are None, bool, int, float, str, bytes, torch tensors or numpy
arrays. `encode_payload` turns it into a Kafka value (plus headers):

- a MiniCPM-o talker -> Code2Wav payload (`codes.audio` plus stream-position keys in `meta`)
  becomes a typed `CodecChunk` value, readable by codeclog's fold, consumer and replay, with a
  `PayloadEnvelope` in the `codeclog.payload` header holding the rest of the tree; the nodes whose
  value the chunk holds are references (`source`), checked to restore exactly;
- any other payload becomes a `PayloadEnvelope` value (schemas/avro/payload_envelope.v1.avsc).

`decode_payload` restores the exact tree: same keys in the same order, same container types,
tensors with the same dtype and shape (on the CPU). Dataclasses, msgspec structs and other
mappings are sent as dicts (as vllm-omni's own serializer does). torch is imported only when a
tensor is met; numpy is a core dependency. Array data is little-endian, C order.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from codeclog.errors import CodeclogError
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk, PayloadEntry, PayloadEnvelope, PayloadKind

HEADER = "codeclog.payload"  # the PayloadEnvelope header of a CodecChunk value
_LONG = (-(2**63), 2**63 - 1)
_CONTAINERS = (PayloadKind.DICT, PayloadKind.LIST, PayloadKind.TUPLE)
Path = tuple[str, ...]

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


class PayloadError(CodeclogError):
    """A payload that cannot be represented, or an envelope that does not describe one."""


@dataclasses.dataclass(frozen=True, slots=True)
class Encoded:
    value: bytes
    headers: list[tuple[str, bytes]]
    record_type: str  # "codec_chunk" or "payload_envelope"
    request_id: str  # the Kafka key

    @property
    def size(self) -> int:
        return len(self.value) + sum(len(v) for _, v in self.headers)


@dataclasses.dataclass(frozen=True, slots=True)
class Decoded:
    envelope: PayloadEnvelope
    payload: Any
    chunk: CodecChunk | None


def parse_put_key(put_key: str) -> tuple[str, str | None, int | None]:
    """`{external_req_id}_{stage}_{chunk_id}` -> (request id, stage, chunk id).

    Another form gives (put_key, None, None).
    """
    parts = put_key.rsplit("_", 2)
    if len(parts) == 3 and parts[0] and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], parts[1], int(parts[2])
    return put_key, None, None


# ---------------------------------------------------------------------------------------------
# leaves


def _torch() -> Any:
    import torch  # lazily: only payloads with tensors need it

    return torch


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return torch is not None and isinstance(value, torch.Tensor)


def _tensor_bytes(tensor: Any) -> tuple[str, tuple[int, ...], bytes]:
    torch = _torch()
    t = tensor.detach().to("cpu").contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return str(t.dtype).removeprefix("torch."), tuple(int(n) for n in t.shape), data


def _tensor_from(dtype: str, shape: Sequence[int], data: bytes) -> Any:
    torch = _torch()
    kind = getattr(torch, dtype, None)
    if not isinstance(kind, torch.dtype):
        raise PayloadError(f"unknown tensor dtype {dtype!r}")
    numel = 1
    for n in shape:
        numel *= int(n)
    itemsize = torch.empty((), dtype=kind).element_size()
    if len(data) != numel * itemsize:
        raise PayloadError(f"tensor of {dtype}{list(shape)} needs {numel * itemsize} bytes")
    if not data:
        return torch.empty(tuple(shape), dtype=kind)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return flat.view(kind).reshape(tuple(shape))


def _array_from(dtype: str, shape: Sequence[int], data: bytes) -> Any:
    try:
        kind = np.dtype(dtype).newbyteorder("<")
        return np.frombuffer(data, dtype=kind).reshape(tuple(shape)).astype(np.dtype(dtype))
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"bad ndarray {dtype}{list(shape)}: {exc}") from exc


def _leaf(path: Path, value: Any) -> PayloadEntry:
    kind = type(value)
    if value is None:
        return PayloadEntry(path, PayloadKind.NONE)
    if kind is bool:
        return PayloadEntry(path, PayloadKind.BOOL, bool_value=value)
    if kind is int:
        if not _LONG[0] <= value <= _LONG[1]:
            raise PayloadError(f"{'.'.join(path)}: int {value} does not fit 64 bits")
        return PayloadEntry(path, PayloadKind.INT, int_value=value)
    if kind is float:
        return PayloadEntry(path, PayloadKind.FLOAT, float_value=value)
    if kind is str:
        return PayloadEntry(path, PayloadKind.STR, str_value=value)
    if kind is bytes:
        return PayloadEntry(path, PayloadKind.BYTES, bytes_value=value)
    if _is_tensor(value):
        dtype, shape, data = _tensor_bytes(value)
        return PayloadEntry(path, PayloadKind.TENSOR, bytes_value=data, dtype=dtype, shape=shape)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise PayloadError(f"{'.'.join(path)}: object arrays cannot be sent")
        data = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()
        shape = tuple(int(n) for n in value.shape)
        return PayloadEntry(
            path, PayloadKind.NDARRAY, bytes_value=data, dtype=value.dtype.name, shape=shape
        )
    raise PayloadError(f"{'.'.join(path) or 'payload'}: cannot send a {kind.__name__}")


def _children(value: Any) -> tuple[PayloadKind, list[tuple[str, Any]]] | None:
    if isinstance(value, Mapping):
        items = list(value.items())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    elif hasattr(type(value), "__struct_fields__"):  # a msgspec Struct (omit_defaults ignored)
        items = [(name, getattr(value, name)) for name in type(value).__struct_fields__]
    elif type(value) in (list, tuple):
        kind = PayloadKind.LIST if type(value) is list else PayloadKind.TUPLE
        return kind, [(str(i), item) for i, item in enumerate(value)]
    else:
        return None
    for key, _ in items:
        if type(key) is not str:
            raise PayloadError(f"dict key {key!r} is not a str")
    return PayloadKind.DICT, items


def _flatten(
    value: Any,
    path: Path,
    out: list[PayloadEntry],
    backed: Callable[[Path, Any], PayloadEntry | None],
) -> None:
    entry = backed(path, value)
    if entry is not None:
        out.append(entry)
        return
    children = _children(value)
    if children is None:
        out.append(_leaf(path, value))
        return
    kind, items = children
    out.append(PayloadEntry(path, kind))
    for key, item in items:
        _flatten(item, (*path, key), out, backed)


def _no_backing(_path: Path, _value: Any) -> PayloadEntry | None:
    return None


def flatten(payload: Any) -> tuple[PayloadEntry, ...]:
    """The payload tree in pre-order, every value inline."""
    out: list[PayloadEntry] = []
    _flatten(payload, (), out, _no_backing)
    return tuple(out)


def _inline_value(entry: PayloadEntry) -> Any:
    kind = entry.kind
    if kind is PayloadKind.NONE:
        return None
    values = {
        PayloadKind.BOOL: entry.bool_value,
        PayloadKind.INT: entry.int_value,
        PayloadKind.FLOAT: entry.float_value,
        PayloadKind.STR: entry.str_value,
        PayloadKind.BYTES: entry.bytes_value,
    }
    if kind in values:
        value = values[kind]
        if value is None:
            raise PayloadError(f"{'.'.join(entry.path)}: {kind.value} node without a value")
        return value
    if entry.bytes_value is None or entry.dtype is None:
        raise PayloadError(f"{'.'.join(entry.path)}: {kind.value} node without data")
    if kind is PayloadKind.TENSOR:
        return _tensor_from(entry.dtype, entry.shape, entry.bytes_value)
    return _array_from(entry.dtype, entry.shape, entry.bytes_value)


def _backed_value(entry: PayloadEntry, chunk: CodecChunk | None) -> Any:
    name = (entry.source or "").removeprefix("codec_chunk.")
    if chunk is None or name not in CHUNK_PATHS:
        raise PayloadError(f"{'.'.join(entry.path)}: no chunk field {entry.source!r}")
    value = getattr(chunk, name)
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
            return _tensor_from(entry.dtype, entry.shape, data)
        return _array_from(entry.dtype, entry.shape, data)
    if value is None:
        raise PayloadError(f"{'.'.join(entry.path)}: chunk field {name} is null")
    return value


def _numpy_name(dtype: str) -> str:
    if dtype == "bool":
        return "bool"
    if dtype in ("bfloat16",):
        raise PayloadError("a bfloat16 tensor cannot be carried by a CodecChunk field")
    return dtype


def rebuild(entries: Sequence[PayloadEntry], chunk: CodecChunk | None = None) -> Any:
    """The payload tree described by `entries` (pre-order); `chunk` supplies `source` values."""
    if not entries or entries[0].path != ():
        raise PayloadError("an envelope starts with its root node")
    value, end = _read(entries, 0, chunk)
    if end != len(entries):
        raise PayloadError(f"node {end} ({'.'.join(entries[end].path)}) is outside the tree")
    return value


def _read(entries: Sequence[PayloadEntry], index: int, chunk: CodecChunk | None) -> tuple[Any, int]:
    entry = entries[index]
    if entry.source is not None:
        return _backed_value(entry, chunk), index + 1
    if entry.kind not in _CONTAINERS:
        return _inline_value(entry), index + 1
    depth = len(entry.path)
    items: list[tuple[str, Any]] = []
    position = index + 1
    while position < len(entries):
        child = entries[position].path
        if len(child) != depth + 1 or child[:depth] != entry.path:
            break
        value, position = _read(entries, position, chunk)
        items.append((child[-1], value))
    if entry.kind is PayloadKind.DICT:
        return dict(items), position
    if [key for key, _ in items] != [str(i) for i in range(len(items))]:
        raise PayloadError(f"{'.'.join(entry.path)}: list indices out of order")
    values = [value for _, value in items]
    return (values if entry.kind is PayloadKind.LIST else tuple(values)), position


# ---------------------------------------------------------------------------------------------
# MiniCPM-o codec payloads as CodecChunk


def is_codec_payload(payload: Any) -> bool:
    """A MiniCPM-o talker -> Code2Wav payload: `codes.audio` and a stream position in `meta`."""
    if not isinstance(payload, Mapping):
        return False
    codes, meta = payload.get("codes"), payload.get("meta")
    return (
        isinstance(codes, Mapping)
        and "audio" in codes
        and isinstance(meta, Mapping)
        and any(key in meta for key in _POSITION_KEYS)
    )


def _get(payload: Mapping[str, Any], path: Path) -> tuple[bool, Any]:
    node: Any = payload
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _field_value(name: str, value: Any) -> tuple[bool, Any]:
    """The CodecChunk value of a payload leaf, if it has one."""
    if _is_tensor(value):
        dtype = str(value.dtype).removeprefix("torch.")
        if name in _BYTES_FIELDS:
            wanted = "float32" if name == "ref_audio" else "uint8"
            if dtype != wanted or value.dim() != 1:
                return False, None
            return True, _tensor_bytes(value)[2]
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


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if _is_tensor(a):
        return bool(
            a.dtype == b.dtype and a.shape == b.shape and _tensor_bytes(a) == _tensor_bytes(b)
        )
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    return bool(a == b)


def _codec_records(
    payload: Mapping[str, Any], request_id: str, now_ms: int, producer_id: str
) -> tuple[CodecChunk, Callable[[Path, Any], PayloadEntry | None]]:
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

    def backed(path: Path, value: Any) -> PayloadEntry | None:
        name = _BY_PATH.get(path)
        if name is None or name not in fields:
            return None
        entry = _reference(path, name, value)
        try:
            if entry is not None and _same(value, _backed_value(entry, chunk)):
                return entry
        except PayloadError:
            pass
        return None

    return chunk, backed


def _reference(path: Path, name: str, value: Any) -> PayloadEntry | None:
    source = f"codec_chunk.{name}"
    if _is_tensor(value):
        shape = tuple(int(n) for n in value.shape)
        dtype = str(value.dtype).removeprefix("torch.")
        return PayloadEntry(path, PayloadKind.TENSOR, dtype=dtype, shape=shape, source=source)
    kinds = {bool: PayloadKind.BOOL, int: PayloadKind.INT, str: PayloadKind.STR}
    kinds.update({bytes: PayloadKind.BYTES, list: PayloadKind.LIST, tuple: PayloadKind.TUPLE})
    kind = kinds.get(type(value))
    return None if kind is None else PayloadEntry(path, kind, source=source)


def encode_payload(
    payload: Any,
    *,
    from_stage: str,
    to_stage: str,
    put_key: str,
    now_ms: int = 0,
    producer_id: str = "",
) -> Encoded:
    """The Kafka value and headers of one put; PayloadError if the payload cannot be sent."""
    request_id, _stage, chunk_id = parse_put_key(put_key)

    def envelope(entries: tuple[PayloadEntry, ...]) -> PayloadEnvelope:
        return PayloadEnvelope(
            request_id, from_stage, to_stage, put_key, entries, chunk_id, now_ms, producer_id
        )

    if is_codec_payload(payload):
        chunk, backed = _codec_records(payload, request_id, now_ms, producer_id)
        out: list[PayloadEntry] = []
        _flatten(payload, (), out, backed)
        try:
            value = wire.encode(chunk)
        except wire.EncodeError:
            value = b""  # a field the chunk cannot carry: the generic envelope then
        if value:
            header = _encode(envelope(tuple(out)))
            return Encoded(value, [(HEADER, header)], "codec_chunk", request_id)
    return Encoded(_encode(envelope(flatten(payload))), [], "payload_envelope", request_id)


def _encode(envelope: PayloadEnvelope) -> bytes:
    try:
        return wire.encode(envelope)
    except wire.EncodeError as exc:
        raise PayloadError(str(exc)) from exc


def decode_payload(
    value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None
) -> Decoded | None:
    """The payload of a record the connector wrote; None for other records (no envelope).

    Raises wire.DecodeError or PayloadError for a damaged record.
    """
    record = wire.decode(value)
    if isinstance(record, PayloadEnvelope):
        return Decoded(record, rebuild(record.entries), None)
    if not isinstance(record, CodecChunk):
        return None
    raw = next((v for k, v in headers or () if k == HEADER), None)
    if raw is None:
        return None  # a plain codeclog chunk (e.g. from the talker hook): not a connector put
    envelope = wire.decode(raw)
    if not isinstance(envelope, PayloadEnvelope):
        raise PayloadError(f"the {HEADER} header holds a {type(envelope).__name__}")
    return Decoded(envelope, rebuild(envelope.entries, record), record)


def minicpmo_payload(chunk: CodecChunk, *, finished: bool = False) -> dict[str, Any]:
    """The payload the upstream producer returns for `chunk` (torch tensors where it has them).

    For tests and tools: what `tts2code2wav_async_chunk` hands the adapter, after the adapter set
    `finished` and `is_segment_finished`.
    """
    torch = _torch()
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
        codes["ref"] = _tensor_from("float32", (len(chunk.ref_audio) // 4,), chunk.ref_audio)
        meta["ref_audio_sr"] = chunk.ref_audio_sr
    return {"codes": codes, "meta": meta}
