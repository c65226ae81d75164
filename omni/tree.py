"""A stage payload as a typed tree: `flatten` to `PayloadEntry` nodes, `rebuild` back, exactly;
torch is imported only when a tensor is met, and nothing here knows MiniCPM-o or Kafka.
The tree on the wire: docs/wire-format.md."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from codeclog.errors import CodeclogError
from codeclog.schemas.records import PayloadEntry, PayloadKind

Path = tuple[str, ...]
Backing = Callable[[Path, Any], PayloadEntry | None]  # a node another record carries, or None
Resolver = Callable[[PayloadEntry], Any]  # the value of a node with a `source`
_LONG = (-(2**63), 2**63 - 1)
_CONTAINERS = (PayloadKind.DICT, PayloadKind.LIST, PayloadKind.TUPLE)


class PayloadError(CodeclogError):
    """A payload that cannot be represented, or an envelope that does not describe one."""


# ---------------------------------------------------------------------------------------------
# containers


def _struct_items(value: Any) -> list[tuple[str, Any]]:
    """A msgspec Struct's fields as msgspec encodes them: without defaults if it omits them."""
    cls = type(value)
    names: tuple[str, ...] = cls.__struct_fields__
    defaults: tuple[Any, ...] = getattr(cls, "__struct_defaults__", ())
    config = getattr(cls, "__struct_config__", None)
    omit = bool(getattr(config, "omit_defaults", False))
    first_default = len(names) - len(defaults)  # defaults belong to the trailing fields
    items = []
    for index, name in enumerate(names):
        item = getattr(value, name)
        if omit and index >= first_default and _is_default(item, defaults[index - first_default]):
            continue
        items.append((name, item))
    return items


def _is_default(value: Any, default: Any) -> bool:
    factory = getattr(default, "factory", None)  # msgspec's Factory (default_factory)
    if callable(factory):
        default = factory()
    if value is default:
        return True
    if type(value) is not type(default) or type(value) not in (bool, int, float, str, list, dict):
        return False
    return bool(value == default)


def _items(value: Any) -> list[tuple[str, Any]] | None:
    """A mapping-like node's items, None for anything else."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif hasattr(type(value), "__struct_fields__"):  # a msgspec Struct
        items = _struct_items(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    else:
        return None
    for key, _ in items:
        if type(key) is not str:
            raise PayloadError(f"dict key {key!r} is not a str")
    return items


def plain(payload: Any) -> Any:
    """The payload with every mapping-like node a dict, as vllm-omni's own serializer makes
    them: a msgspec Struct (vllm-omni's `OmniPayloadStruct`) without the fields msgspec's
    encoding leaves out (those holding their default when the struct type says
    `omit_defaults`), a dataclass with every field, any Mapping with its items."""
    items = _items(payload)
    if items is not None:
        return {key: plain(item) for key, item in items}
    if type(payload) in (list, tuple):
        return type(payload)(plain(item) for item in payload)
    return payload


def _children(value: Any) -> tuple[PayloadKind, list[tuple[str, Any]]] | None:
    items = _items(value)
    if items is not None:
        return PayloadKind.DICT, items
    if type(value) in (list, tuple):
        kind = PayloadKind.LIST if type(value) is list else PayloadKind.TUPLE
        return kind, [(str(i), item) for i, item in enumerate(value)]
    return None


# ---------------------------------------------------------------------------------------------
# leaves


def _torch() -> Any:
    import torch  # lazily: only payloads with tensors need it

    return torch


def is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return torch is not None and isinstance(value, torch.Tensor)


def tensor_bytes(tensor: Any) -> tuple[str, tuple[int, ...], bytes]:
    """(dtype name, shape, little-endian C-order bytes) of a tensor, on the CPU."""
    torch = _torch()
    t = tensor.detach().to("cpu").contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return str(t.dtype).removeprefix("torch."), tuple(int(n) for n in t.shape), data


def tensor_from(dtype: str, shape: Sequence[int], data: bytes) -> Any:
    """The tensor of `tensor_bytes`' three parts."""
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


def array_from(dtype: str, shape: Sequence[int], data: bytes) -> Any:
    """The numpy array of a dtype name, a shape and little-endian bytes."""
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
    if is_tensor(value):
        dtype, shape, data = tensor_bytes(value)
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


# ---------------------------------------------------------------------------------------------
# the tree


def _flatten(value: Any, path: Path, out: list[PayloadEntry], backed: Backing) -> None:
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


def flatten(payload: Any, backed: Backing = _no_backing) -> tuple[PayloadEntry, ...]:
    """The payload tree in pre-order; `backed` names the nodes another record carries. A
    payload (what a vllm-omni stage input processor returns and an OmniConnector moves) is a
    tree of containers (dicts, lists, tuples) whose leaves are None, bool, int, float, str,
    bytes, torch tensors or numpy arrays; array data is little-endian, C order."""
    out: list[PayloadEntry] = []
    _flatten(payload, (), out, backed)
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
        return tensor_from(entry.dtype, entry.shape, entry.bytes_value)
    return array_from(entry.dtype, entry.shape, entry.bytes_value)


def _unresolved(entry: PayloadEntry) -> Any:
    raise PayloadError(f"{'.'.join(entry.path)}: no record carries {entry.source!r}")


def rebuild(entries: Sequence[PayloadEntry], resolve: Resolver = _unresolved) -> Any:
    """The payload tree described by `entries` (pre-order); `resolve` gives `source` values.
    The same keys in the same order, the same container types, tensors with the same dtype and
    shape (on the CPU)."""
    if not entries or entries[0].path != ():
        raise PayloadError("an envelope starts with its root node")
    value, end = _read(entries, 0, resolve)
    if end != len(entries):
        raise PayloadError(f"node {end} ({'.'.join(entries[end].path)}) is outside the tree")
    return value


def _read(entries: Sequence[PayloadEntry], index: int, resolve: Resolver) -> tuple[Any, int]:
    entry = entries[index]
    if entry.source is not None:
        return resolve(entry), index + 1
    if entry.kind not in _CONTAINERS:
        return _inline_value(entry), index + 1
    depth = len(entry.path)
    items: list[tuple[str, Any]] = []
    position = index + 1
    while position < len(entries):
        child = entries[position].path
        if len(child) != depth + 1 or child[:depth] != entry.path:
            break
        value, position = _read(entries, position, resolve)
        items.append((child[-1], value))
    if entry.kind is PayloadKind.DICT:
        return dict(items), position
    if [key for key, _ in items] != [str(i) for i in range(len(items))]:
        raise PayloadError(f"{'.'.join(entry.path)}: list indices out of order")
    values = [value for _, value in items]
    return (values if entry.kind is PayloadKind.LIST else tuple(values)), position


def same(a: Any, b: Any) -> bool:
    """Equal leaves of equal types (tensors and arrays by dtype, shape and bytes; NaN == NaN)."""
    if type(a) is not type(b):
        return False
    if is_tensor(a):
        return bool(
            a.dtype == b.dtype and a.shape == b.shape and tensor_bytes(a) == tensor_bytes(b)
        )
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    return bool(a == b)
