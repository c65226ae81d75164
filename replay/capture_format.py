"""The capture file: an Avro object container file (OCF) with one record per Kafka record.
Its layout: docs/replay.md, "The capture file"."""

from __future__ import annotations

import dataclasses
import enum
import io
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, cast

import fastavro
from fastavro.read import HEADER_SCHEMA
from fastavro.schema import to_parsing_canonical_form
from fastavro.write import Writer

from codeclog.json_values import (
    JsonValueError,
    json_dict,
    json_int,
    json_list,
    json_str,
    json_value,
)
from codeclog.replay.capture_blocks import CODECS, BlockReader, SkippedBlock
from codeclog.replay.errors import CaptureFormatError
from codeclog.user_files import create_binary, open_binary, user_file_error

FORMAT_VERSION = "1"
OCF_MAGIC = b"Obj\x01"
CODEC = "deflate"
SCHEMA_NAME = "codeclog.capture.CapturedRecord"
SOE_MARKER = b"\xc3\x01"  # Avro single-object encoding: marker, 8-byte fingerprint, body

CAPTURE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "CapturedRecord",
    "namespace": "codeclog.capture",
    "doc": "One Kafka record as a read_committed consumer observed it.",
    "fields": [
        {"name": "topic", "type": "string"},
        {"name": "partition", "type": "int"},
        {"name": "offset", "type": "long", "doc": "as observed; never assumed contiguous"},
        {"name": "timestamp_ms", "type": "long", "doc": "the record timestamp (Unix ms)"},
        {
            "name": "timestamp_type",
            "type": {
                "type": "enum",
                "name": "TimestampType",
                "symbols": ["NOT_AVAILABLE", "CREATE_TIME", "LOG_APPEND_TIME"],
            },
        },
        {"name": "key", "type": ["null", "bytes"], "default": None},
        {
            "name": "headers",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "RecordHeader",
                    "fields": [
                        {"name": "key", "type": "string"},
                        {"name": "value", "type": ["null", "bytes"], "default": None},
                    ],
                },
            },
            "default": [],
        },
        {
            "name": "value",
            "type": ["null", "bytes"],
            "doc": "the value bytes exactly as consumed (null for a tombstone)",
        },
        {
            "name": "schema_fingerprint",
            "type": ["null", {"type": "fixed", "name": "Fingerprint", "size": 8}],
            "default": None,
            "doc": "CRC-64-AVRO fingerprint of the value's writer schema, when it is SOE-framed",
        },
        {"name": "observed_at_ms", "type": "long", "doc": "capture wall clock; never replayed"},
        {"name": "leader_epoch", "type": ["null", "int"], "default": None},
    ],
}
_PARSED_SCHEMA = fastavro.parse_schema(CAPTURE_SCHEMA)
_CANONICAL_SCHEMA = to_parsing_canonical_form(_PARSED_SCHEMA)
_FIELD_TYPES = {
    f["name"]: to_parsing_canonical_form(f["type"])
    for f in cast(dict[str, Any], _PARSED_SCHEMA)["fields"]
}


class TimestampType(enum.Enum):
    """The Kafka timestamp type of a record (the Avro symbol is the member name)."""

    NOT_AVAILABLE = "not_available"
    CREATE_TIME = "create_time"
    LOG_APPEND_TIME = "log_append_time"

    @classmethod
    def from_kafka(cls, code: int) -> TimestampType:
        """Map confluent-kafka's TIMESTAMP_* constants (0, 1, 2)."""
        return _KAFKA_TIMESTAMP_TYPES.get(code, cls.NOT_AVAILABLE)


_TIMESTAMP_TYPES_BY_SYMBOL = {member.name: member for member in TimestampType}
_KAFKA_TIMESTAMP_TYPES = {
    0: TimestampType.NOT_AVAILABLE,
    1: TimestampType.CREATE_TIME,
    2: TimestampType.LOG_APPEND_TIME,
}


@dataclasses.dataclass(frozen=True, slots=True)
class RecordHeader:
    """One Kafka record header."""

    key: str
    value: bytes | None


@dataclasses.dataclass(frozen=True, slots=True)
class CapturedRecord:
    """One captured Kafka record (identity first: where it was in the log)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: TimestampType
    key: bytes | None
    value: bytes | None  # exactly as consumed
    headers: tuple[RecordHeader, ...] = ()
    schema_fingerprint: bytes | None = None  # 8 bytes when the value is SOE-framed
    observed_at_ms: int = 0  # capture wall clock; the fold never sees it
    leader_epoch: int | None = None

    def to_avro(self) -> dict[str, Any]:
        """The capture schema's record: these fields under their names, the timestamp type
        as its enum symbol and the headers as key/value records."""
        raw = {name: getattr(self, name) for name in _CAPTURED_FIELDS}
        raw["timestamp_type"] = self.timestamp_type.name
        raw["headers"] = [{"key": h.key, "value": h.value} for h in self.headers]
        return raw

    @classmethod
    def from_avro(cls, raw: Mapping[str, Any]) -> CapturedRecord:
        # Positional and with a symbol table: this runs once per record on every replay.
        headers = raw["headers"]
        return cls(
            raw["topic"],
            raw["partition"],
            raw["offset"],
            raw["timestamp_ms"],
            _TIMESTAMP_TYPES_BY_SYMBOL[raw["timestamp_type"]],
            raw["key"],
            raw["value"],
            tuple(RecordHeader(h["key"], h["value"]) for h in headers) if headers else (),
            raw["schema_fingerprint"],
            raw["observed_at_ms"],
            raw["leader_epoch"],
        )


_CAPTURED_FIELDS = tuple(field.name for field in dataclasses.fields(CapturedRecord))


def fingerprint_of_value(value: bytes | None) -> bytes | None:
    """The writer-schema fingerprint of an SOE-framed value, else None (no decoding needed)."""
    if value is None or len(value) < 10 or value[:2] != SOE_MARKER:
        return None
    return value[2:10]


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionSpan:
    """The offsets a capture covered on one partition: [start, end), end exclusive."""

    partition: int
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class CaptureMetadata:
    """The file header: where and how the records were captured. Values are JSON-able."""

    topic: str
    partition_count: int
    spans: tuple[PartitionSpan, ...]
    cluster_id: str
    created_at_ms: int
    isolation_level: str = "read_committed"
    codeclog_version: str = "unknown"
    git_commit: str = "unknown"
    schema_fingerprints: Mapping[str, str] = dataclasses.field(default_factory=dict)
    request_filter: tuple[str, ...] = ()  # empty: every key
    client_versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    format_version: str = FORMAT_VERSION

    def to_avro_metadata(self) -> dict[str, str]:
        spans = {str(s.partition): {"start": s.start, "end": s.end} for s in self.spans}
        return {
            "capture.format_version": self.format_version,
            "capture.created_at_ms": str(self.created_at_ms),
            "capture.request_filter": _dumps(list(self.request_filter)),
            "codeclog.version": self.codeclog_version,
            "codeclog.git_commit": self.git_commit,
            "codeclog.schema_fingerprints": _dumps(dict(self.schema_fingerprints)),
            "kafka.cluster_id": self.cluster_id,
            "kafka.topic": self.topic,
            "kafka.partition_count": str(self.partition_count),
            "kafka.isolation_level": self.isolation_level,
            "kafka.offsets": _dumps(spans),
            "client.versions": _dumps(dict(self.client_versions)),
        }

    @classmethod
    def from_avro_metadata(cls, meta: Mapping[str, str]) -> CaptureMetadata:
        """The header's values, each checked for its type (CaptureFormatError names the key)."""
        version = _header_value(meta, "capture.format_version", json_str, raw=True)
        if version != FORMAT_VERSION:
            raise CaptureFormatError(
                f"capture format version {version} is not supported (this codeclog reads "
                f"{FORMAT_VERSION}); use the codeclog version that wrote it"
            )
        return CaptureMetadata(
            topic=_header_value(meta, "kafka.topic", json_str, raw=True),
            partition_count=_header_value(meta, "kafka.partition_count", json_int),
            spans=_header_value(meta, "kafka.offsets", _spans),
            cluster_id=_header_value(meta, "kafka.cluster_id", json_str, raw=True),
            created_at_ms=_header_value(meta, "capture.created_at_ms", json_int),
            isolation_level=_header_value(meta, "kafka.isolation_level", json_str, raw=True),
            codeclog_version=_header_value(meta, "codeclog.version", json_str, raw=True),
            git_commit=_header_value(meta, "codeclog.git_commit", json_str, raw=True),
            schema_fingerprints=_header_value(meta, "codeclog.schema_fingerprints", _texts),
            request_filter=tuple(_header_value(meta, "capture.request_filter", _strings)),
            client_versions=_header_value(meta, "client.versions", _texts, default="{}"),
            format_version=version,
        )

    def provenance(self) -> dict[str, Any]:
        """The header as a JSON object, for the replay report (sorted, no local paths)."""
        return {
            "cluster_id": self.cluster_id,
            "codeclog_version": self.codeclog_version,
            "created_at_ms": self.created_at_ms,
            "format_version": self.format_version,
            "git_commit": self.git_commit,
            "isolation_level": self.isolation_level,
            "offsets": {str(s.partition): [s.start, s.end] for s in self.spans},
            "partition_count": self.partition_count,
            "request_filter": list(self.request_filter),
            "schema_fingerprints": dict(self.schema_fingerprints),
            "topic": self.topic,
        }


def _header_value(
    meta: Mapping[str, str],
    key: str,
    parse: Callable[[Any], Any],
    raw: bool = False,
    default: str | None = None,
) -> Any:
    """The header's `key`: its text itself (`raw`) or the JSON it holds, checked by `parse`."""
    text = meta.get(key, default)
    if text is None:
        raise CaptureFormatError(f"the capture header lacks {key}")
    try:
        return parse(text if raw else json_value(text))
    except JsonValueError as exc:
        raise CaptureFormatError(f"the capture header's {key} is malformed: {exc}") from None


def _spans(value: Any) -> tuple[PartitionSpan, ...]:
    spans = []
    for partition, span in json_dict(value).items():
        if not partition.isdecimal():
            raise JsonValueError(f"expected a partition number, got {partition!r}")
        bounds = json_dict(span)
        spans.append(
            PartitionSpan(int(partition), *(json_int(bounds.get(k)) for k in ("start", "end")))
        )
    return tuple(sorted(spans, key=lambda span: span.partition))


def _strings(value: Any) -> list[str]:
    return [json_str(item) for item in json_list(value)]


def _texts(value: Any) -> dict[str, str]:
    return {key: json_str(text) for key, text in json_dict(value).items()}


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class CaptureWriter:
    """Writes captured records; `flush()` closes a block so a crash loses at most one batch."""

    def __init__(self, fo: IO[bytes], metadata: CaptureMetadata, sync_marker: bytes = b"") -> None:
        # sync_marker is random unless given: tests pass one to get byte-identical files.
        self._fo = fo
        self._writer = Writer(
            fo,
            _PARSED_SCHEMA,
            codec=CODEC,
            metadata=metadata.to_avro_metadata(),
            sync_marker=sync_marker,
        )
        self.records_written = 0

    def write(self, record: CapturedRecord) -> None:
        self._writer.write(record.to_avro())
        self.records_written += 1

    def flush(self) -> None:
        self._writer.flush()
        self._fo.flush()


class CaptureFile:
    """A capture file opened for writing: `with CaptureFile.create(path, meta) as writer`."""

    def __init__(self, fo: IO[bytes], writer: CaptureWriter) -> None:
        self._fo = fo
        self.writer = writer

    @classmethod
    def create(cls, path: str | Path, metadata: CaptureMetadata) -> CaptureFile:
        fo = create_binary(path, "capture file")  # UserFileError: exit 2
        return cls(fo, CaptureWriter(fo, metadata))

    def __enter__(self) -> CaptureWriter:
        return self.writer

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.writer.flush()
        finally:
            self._fo.close()


def is_capture_file(path: str | Path) -> bool:
    """True when the file starts with the OCF magic (a JSONL scenario or report does not);
    UserFileError (exit 2) when it cannot be read."""
    with open_binary(path, "input") as fo:
        try:
            return fo.read(len(OCF_MAGIC)) == OCF_MAGIC
        except OSError as exc:
            raise user_file_error("read", "input", path, exc) from exc


# What fastavro raises on a header it cannot read (cut short, or bytes that are no header).
_HEADER_ERRORS = (EOFError, ValueError, IndexError, OverflowError, MemoryError, StopIteration)


@dataclasses.dataclass(frozen=True)
class CaptureHeader:
    """A capture's header, checked: its metadata, and what reading its blocks needs."""

    metadata: CaptureMetadata
    codec: str
    sync: bytes


def read_header(fo: IO[bytes]) -> CaptureHeader:
    """The header of the capture `fo` starts with; `fo` is left at its first block."""
    try:
        raw = fastavro.schemaless_reader(fo, HEADER_SCHEMA, None)
    except _HEADER_ERRORS as exc:
        raise CaptureFormatError(f"not a readable Avro capture ({exc!r})") from exc
    if not isinstance(raw, dict) or raw.get("magic") != OCF_MAGIC:
        raise CaptureFormatError("not a readable Avro capture (no Obj\\x01 magic)")
    try:
        meta = {key: value.decode("utf-8") for key, value in raw["meta"].items()}
    except UnicodeDecodeError:
        raise CaptureFormatError("the capture header is not UTF-8 text") from None
    _check_schema(meta.get("avro.schema", "null"))
    codec = meta.get("avro.codec", "null")
    if codec not in CODECS:
        raise CaptureFormatError(f"the capture's blocks use the codec {codec!r}, not deflate")
    return CaptureHeader(CaptureMetadata.from_avro_metadata(meta), codec, raw["sync"])


def _check_schema(text: str) -> None:
    """The file's record schema is the capture schema: the same fields with the same types."""
    try:
        schema = json_value(text)
    except JsonValueError as exc:
        raise CaptureFormatError(f"the capture's Avro schema is not JSON ({exc})") from None
    name = schema.get("name") if isinstance(schema, dict) else None
    if name not in (SCHEMA_NAME, SCHEMA_NAME.rsplit(".", 1)[1]):
        raise CaptureFormatError("the file is an Avro container but not a codeclog capture")
    try:
        if to_parsing_canonical_form(schema) == _CANONICAL_SCHEMA:
            return
        found = {f["name"]: to_parsing_canonical_form(f["type"]) for f in schema["fields"]}
    except Exception:
        raise CaptureFormatError("the capture's Avro schema is not a valid schema") from None
    missing = [field for field in _FIELD_TYPES if field not in found]
    if missing:
        raise CaptureFormatError(f"the capture's records lack the field(s) {', '.join(missing)}")
    other = [field for field, kind in _FIELD_TYPES.items() if found[field] != kind]
    detail = ", ".join(f"{field} is {found[field]}, not {_FIELD_TYPES[field]}" for field in other)
    raise CaptureFormatError(
        "the capture's record schema is not codeclog's" + (f": {detail}" if detail else "")
    )


def _decode_records(data: bytes, count: int) -> list[dict[str, Any]]:
    """The `count` records of an inflated block; ValueError unless they fill it exactly."""
    stream = io.BytesIO(data)
    try:
        records = [
            cast(dict[str, Any], fastavro.schemaless_reader(stream, _PARSED_SCHEMA, None))
            for _ in range(count)
        ]
    except (EOFError, IndexError, OverflowError, MemoryError, StopIteration) as exc:
        raise ValueError(repr(exc)) from None
    if stream.tell() != len(data):
        raise ValueError(f"{len(data) - stream.tell():,} bytes follow its {count:,} records")
    return records


class CaptureReader:
    """Reads a capture: `metadata`, then `records()` in file order. Stops at a torn last block
    (`truncated`); a corrupt block is CorruptBlockError, or skipped with `skip_corrupt`
    (`skipped`)."""

    def __init__(self, fo: IO[bytes], skip_corrupt: bool = False) -> None:
        header = read_header(fo)
        self.metadata = header.metadata
        self._blocks = BlockReader(fo, header.sync, header.codec, _decode_records, skip_corrupt)

    @property
    def truncated(self) -> bool:
        """The last block was torn (a crashed capture)."""
        return self._blocks.truncated

    @property
    def skipped(self) -> tuple[SkippedBlock, ...]:
        return tuple(self._blocks.skipped)

    def records(self) -> Iterator[CapturedRecord]:
        for block in self._blocks:
            for raw in block:
                yield CapturedRecord.from_avro(raw)


@dataclasses.dataclass(frozen=True)
class Capture:
    """A whole capture: its header, its records in file order, and how its end looked."""

    metadata: CaptureMetadata
    records: list[CapturedRecord]
    truncated: bool = False
    skipped: tuple[SkippedBlock, ...] = ()


def read_records(fo: IO[bytes], skip_corrupt: bool = False) -> Capture:
    """The capture `fo` holds (seekable, at its start)."""
    reader = CaptureReader(fo, skip_corrupt)
    records = list(reader.records())
    return Capture(reader.metadata, records, reader.truncated, reader.skipped)


def read_capture(path: str | Path) -> tuple[CaptureMetadata, list[CapturedRecord], bool]:
    """The whole capture: (metadata, records in file order, truncated)."""
    try:
        with open(path, "rb") as fo:
            capture = read_records(fo)
    except OSError as exc:
        raise user_file_error("read", "capture", path, exc) from exc
    return capture.metadata, capture.records, capture.truncated
