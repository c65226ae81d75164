"""The capture file: an Avro object container file (OCF) with one record per Kafka record.

Layout (kafka.md E.7/E.8): magic `Obj\\x01`, a metadata map (the Avro schema and codec plus the
`capture.*`, `codeclog.*`, `kafka.*` and `client.*` keys of `CaptureMetadata`), a sync marker,
then deflate blocks. Each record keeps the value bytes exactly as consumed, so a replay decodes
what the live consumer decoded, and the position (partition, offset) exactly as observed: offsets
on a transactional topic are not contiguous (commit markers, aborted records), so nothing here
assumes they are.

The writer ends a block on every `flush()`; since every block ends with the sync marker, a capture
that crashed stays readable up to its last flushed block (`CaptureReader.truncated` tells).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import fastavro
from fastavro.write import Writer

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
        try:
            return _metadata_from_avro(meta)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise CaptureFormatError(f"the capture header is malformed ({exc!r})") from exc

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


def _metadata_from_avro(meta: Mapping[str, str]) -> CaptureMetadata:
    version = meta["capture.format_version"]
    if version != FORMAT_VERSION:
        raise CaptureFormatError(
            f"capture format version {version} is not supported (this codeclog reads "
            f"{FORMAT_VERSION}); use the codeclog version that wrote it"
        )
    offsets = json.loads(meta["kafka.offsets"])
    spans = tuple(
        PartitionSpan(int(p), int(v["start"]), int(v["end"]))
        for p, v in sorted(offsets.items(), key=lambda kv: int(kv[0]))
    )
    return CaptureMetadata(
        topic=meta["kafka.topic"],
        partition_count=int(meta["kafka.partition_count"]),
        spans=spans,
        cluster_id=meta["kafka.cluster_id"],
        created_at_ms=int(meta["capture.created_at_ms"]),
        isolation_level=meta["kafka.isolation_level"],
        codeclog_version=meta["codeclog.version"],
        git_commit=meta["codeclog.git_commit"],
        schema_fingerprints=dict(json.loads(meta["codeclog.schema_fingerprints"])),
        request_filter=tuple(json.loads(meta["capture.request_filter"])),
        client_versions=dict(json.loads(meta.get("client.versions", "{}"))),
        format_version=version,
    )


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
        return fo.read(len(OCF_MAGIC)) == OCF_MAGIC


# What fastavro raises on a block cut short by a crash (checked by truncating at every byte).
_TRUNCATION_ERRORS = (EOFError, ValueError, IndexError, zlib.error, StopIteration)


class CaptureReader:
    """Reads a capture: `metadata`, then `records()` in file order. Stops at a torn last block."""

    def __init__(self, fo: IO[bytes]) -> None:
        self._fo = fo
        try:
            self._blocks = fastavro.block_reader(fo)
        except _TRUNCATION_ERRORS as exc:
            raise CaptureFormatError(f"not a readable Avro capture ({exc!r})") from exc
        schema = self._blocks.writer_schema
        if not isinstance(schema, dict) or schema.get("name") != SCHEMA_NAME:
            raise CaptureFormatError("the file is an Avro container but not a codeclog capture")
        self.metadata = CaptureMetadata.from_avro_metadata(self._blocks.metadata)
        self.truncated = False  # set when the last block was torn (a crashed capture)

    def records(self) -> Iterator[CapturedRecord]:
        for block in self._whole_blocks():
            for raw in block:
                yield CapturedRecord.from_avro(raw)

    def raw_records(self) -> Iterator[dict[str, Any]]:
        """Records as fastavro dicts (`timestamp_type` is the Avro symbol): the fast path."""
        for block in self._whole_blocks():
            yield from block

    def _whole_blocks(self) -> Iterator[list[dict[str, Any]]]:
        iterator = iter(self._blocks)
        while True:
            try:
                block: list[dict[str, Any]] = list(next(iterator))  # type: ignore[arg-type]
            except StopIteration:
                return
            except _TRUNCATION_ERRORS:
                self.truncated = True
                return
            yield block


def read_capture(path: str | Path) -> tuple[CaptureMetadata, list[CapturedRecord], bool]:
    """The whole capture: (metadata, records in file order, truncated)."""
    try:
        with open(path, "rb") as fo:
            reader = CaptureReader(fo)
            records = list(reader.records())
            return reader.metadata, records, reader.truncated
    except OSError as exc:
        raise user_file_error("read", "capture", path, exc) from exc
