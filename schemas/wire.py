"""The wire form of the codeclog records: Avro single-object encoding (SOE); `decode` is total.
Reasons: docs/wire-format.md."""

from __future__ import annotations

import enum
import io
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.validation import ValidationError, validate

from codeclog.schemas.catalog import Record, Registry, SchemaVersion, WireError, registry

MARKER = b"\xc3\x01"  # SOE version 1 marker (Avro spec, "Single object encoding")
FINGERPRINT_BYTES = 8
HEADER_BYTES = len(MARKER) + FINGERPRINT_BYTES


class DecodeReason(enum.Enum):
    """Why a value could not be decoded. Values are stable: they are dead-letter reasons."""

    EMPTY = "empty"  # no value at all (None or zero bytes, e.g. a tombstone)
    NOT_SINGLE_OBJECT = "not_single_object"  # does not start with the C3 01 marker
    TRUNCATED = "truncated"  # ends inside the header or body (or a length points past the end)
    UNKNOWN_FINGERPRINT = "unknown_fingerprint"  # writer schema is not one we ship
    MALFORMED = "malformed"  # the body is not valid Avro for its writer schema
    TRAILING_BYTES = "trailing_bytes"  # bytes left over after a complete record
    INVALID_VALUE = "invalid_value"  # decodes, but a value is out of its type's range


class DecodeError(WireError):
    """A value that is not a valid codeclog record; keeps the raw bytes for the dead letter."""

    def __init__(self, raw: bytes, reason: DecodeReason, detail: str) -> None:
        self.raw = raw
        self.reason = reason
        self.detail = detail
        super().__init__(f"cannot decode a {len(raw)}-byte value ({reason.value}): {detail}")


class EncodeError(WireError):
    """A record that cannot be written: not a record type, or a value outside its Avro type."""

    def __init__(self, record_type: str, detail: str) -> None:
        self.record_type = record_type
        self.detail = detail
        super().__init__(f"cannot encode {record_type}: {detail}")


def wire_fingerprint(data: bytes | bytearray | memoryview | None) -> bytes | None:
    """The 8 fingerprint bytes of an SOE-framed value, or None if it is not framed as SOE."""
    if data is None or len(data) < HEADER_BYTES or bytes(data[:2]) != MARKER:
        return None
    return bytes(data[2:HEADER_BYTES])


# ---------------------------------------------------------------------------------------------
# encode


def encode(record: Record) -> bytes:
    """The SOE bytes of `record`, written with the latest schema of its type."""
    known = registry()
    version = known.latest_by_type.get(type(record))
    if version is None:
        raise EncodeError(type(record).__name__, "not a codeclog record type")
    values = known.mappings[version.name].avro_values(record)
    if not all(check(values[field]) for field, check in version.value_checks):
        _validate_for_encode(version, values)
    buffer = io.BytesIO()
    buffer.write(MARKER)
    buffer.write(version.fingerprint)
    try:
        schemaless_writer(buffer, version.parsed, values)
    except Exception as exc:  # fastavro raises assorted types; the contract is one error type
        raise EncodeError(version.record_type.__name__, str(exc)) from exc
    return buffer.getvalue()


def _validate_for_encode(version: SchemaVersion, values: dict[str, Any]) -> None:
    # fastavro's writer silently truncates an out-of-range int, so a value the exact checks
    # did not vouch for goes through fastavro's validator: it refuses with a message naming
    # the field, or accepts what the exact checks are too strict for (e.g. numpy integers).
    try:
        validate(values, version.parsed, raise_errors=True)
    except ValidationError as exc:
        detail = "; ".join(str(error) for error in exc.errors) or str(exc)
        raise EncodeError(version.record_type.__name__, detail) from exc
    except Exception as exc:  # e.g. an exotic value the validator itself trips on
        raise EncodeError(version.record_type.__name__, repr(exc)) from exc


# ---------------------------------------------------------------------------------------------
# decode


def decode(data: bytes | bytearray | memoryview | None) -> Record:
    """The record in `data`, resolved into the latest schema of its type.

    Raises DecodeError (and nothing else) for any value that is not a valid record.
    """
    raw = b"" if data is None else bytes(data)
    known = registry()
    writer = _writer_version(raw, known)
    reader = known.latest[writer.name]
    values = _read_body(raw, writer, reader)
    _check_ranges(raw, reader, values)
    return known.mappings[reader.name].build(values)


def _writer_version(raw: bytes, known: Registry) -> SchemaVersion:
    if not raw:
        raise DecodeError(raw, DecodeReason.EMPTY, "no value")
    if not MARKER.startswith(raw[:2]):  # a lone C3 is a truncated header, not a foreign value
        raise DecodeError(raw, DecodeReason.NOT_SINGLE_OBJECT, "no C3 01 single-object marker")
    if len(raw) < HEADER_BYTES:
        raise DecodeError(raw, DecodeReason.TRUNCATED, "ends inside the 10-byte header")
    version = known.by_fingerprint.get(raw[2:HEADER_BYTES])
    if version is None:
        fp = raw[2:HEADER_BYTES].hex()
        raise DecodeError(raw, DecodeReason.UNKNOWN_FINGERPRINT, f"unknown writer schema {fp}")
    return version


def _read_body(raw: bytes, writer: SchemaVersion, reader: SchemaVersion) -> dict[str, Any]:
    stream = io.BytesIO(raw)
    stream.seek(HEADER_BYTES)
    # Reading with the writer schema alone is much cheaper than resolving; only older writers
    # need resolution into the latest version.
    reader_schema = None if writer is reader else reader.parsed
    try:
        values = schemaless_reader(stream, writer.parsed, reader_schema)
    except EOFError as exc:
        raise DecodeError(raw, DecodeReason.TRUNCATED, f"{writer.label} body ends early") from exc
    except Exception as exc:  # fastavro raises IndexError, ValueError, UnicodeDecodeError, ...
        detail = f"{writer.label} body: {type(exc).__name__}: {exc}"
        raise DecodeError(raw, DecodeReason.MALFORMED, detail) from exc
    if stream.tell() != len(raw):
        extra = len(raw) - stream.tell()
        raise DecodeError(raw, DecodeReason.TRAILING_BYTES, f"{extra} bytes after the record")
    if not isinstance(values, dict):
        raise DecodeError(raw, DecodeReason.MALFORMED, f"{writer.label} body is not a record")
    return values


def _check_ranges(raw: bytes, reader: SchemaVersion, values: dict[str, Any]) -> None:
    # fastavro reads an Avro int as a 64-bit varint without a range check.
    for field, low, high in reader.scalar_ranges:
        value = values[field]
        if value is not None and not low <= value <= high:
            _raise_out_of_range(raw, reader, field, low, high)
    for field, low, high in reader.array_ranges:
        items = values[field]
        if items and (min(items) < low or max(items) > high):
            _raise_out_of_range(raw, reader, field, low, high)


def _raise_out_of_range(raw: bytes, reader: SchemaVersion, field: str, low: int, high: int) -> None:
    detail = f"{reader.label}.{field} has a value outside [{low}, {high}]"
    raise DecodeError(raw, DecodeReason.INVALID_VALUE, detail)
