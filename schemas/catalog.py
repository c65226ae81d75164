"""The shipped schema versions: the `<name>.v<N>.avsc` files in `schemas/avro/`, one catalog.
Reasons: docs/wire-format.md, "Evolution rules"."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeAlias

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from codeclog.errors import CodeclogError
from codeclog.schemas.records import (
    AudioChunk,
    CodecChunk,
    ControlEvent,
    ControlKind,
    DeadLetter,
    HandOutEnd,
    HandOutMark,
    HandOutMove,
    PayloadEntry,
    PayloadEnvelope,
    PayloadKind,
    StreamCheckpoint,
    slot_constructor,
)

Record: TypeAlias = (
    CodecChunk
    | ControlEvent
    | AudioChunk
    | DeadLetter
    | StreamCheckpoint
    | PayloadEnvelope
    | HandOutMark
    | HandOutMove
)

AVRO_DIR = Path(__file__).parent / "avro"

# Schema file name -> record type. The file stem is the stable name used in labels and docs.
RECORD_TYPES: dict[str, type[Record]] = {
    "codec_chunk": CodecChunk,
    "control_event": ControlEvent,
    "audio_chunk": AudioChunk,
    "dead_letter": DeadLetter,
    "stream_checkpoint": StreamCheckpoint,
    "payload_envelope": PayloadEnvelope,
    "handout_mark": HandOutMark,
    "handout_move": HandOutMove,
}

_INT_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_FILE_NAME = re.compile(r"^(?P<name>[a-z_]+)\.v(?P<version>[1-9][0-9]*)\.avsc$")


class WireError(CodeclogError):
    """Base of the wire-format errors: a shipped schema folder that is wrong raises it itself,
    a value that cannot be encoded or decoded one of its kinds (`schemas.wire`)."""


# (field, low, high): an integer field whose decoded values must fit its Avro type. Plain tuples
# because the decoder walks them for every record.
RangeCheck: TypeAlias = tuple[str, int, int]
# True when a Python value certainly fits an Avro type (exact types only; False means "ask
# fastavro's validator", which accepts e.g. numpy integers and explains what is wrong).
ValueCheck: TypeAlias = Callable[[Any], bool]


@dataclasses.dataclass(frozen=True, eq=False)
class SchemaVersion:
    """One shipped `.avsc` file, parsed once."""

    name: str  # file stem, e.g. "codec_chunk"
    version: int
    record_type: type[Record]
    fingerprint: bytes  # 8 bytes, little-endian, as on the wire
    canonical_form: str  # Parsing Canonical Form (what the fingerprint hashes)
    text: str  # the .avsc file as shipped
    parsed: Any  # the fastavro-parsed schema
    scalar_ranges: tuple[RangeCheck, ...]  # int/long fields, nullable ones included
    array_ranges: tuple[RangeCheck, ...]  # array<int>/array<long> fields, checked per item
    value_checks: tuple[tuple[str, ValueCheck], ...]  # (field, exact check), see _value_check

    @property
    def label(self) -> str:
        return f"{self.name}.v{self.version}"


@dataclasses.dataclass(frozen=True)
class RecordMapping:
    """Record <-> Avro dict for one record type: the one place the two forms meet.

    A frozen dataclass's __init__ pays an `object.__setattr__` per field (half the decode time
    of a codec chunk); the records are plain slotted value objects without `__post_init__`, so
    `construct` (records.slot_constructor) fills the slots directly. `_mapping` refuses a type
    where that would skip logic.
    """

    record_type: type[Record]
    field_names: tuple[str, ...]
    to_record: tuple[tuple[str, Callable[[Any], Any]], ...]  # Avro value -> record value
    to_avro: tuple[tuple[str, Callable[[Any], Any]], ...]  # record value -> Avro value
    construct: Callable[..., Record]  # field values in field order -> record

    def build(self, values: dict[str, Any]) -> Record:
        for name, convert in self.to_record:
            values[name] = convert(values[name])
        return self.construct(*[values[name] for name in self.field_names])

    def avro_values(self, record: Record) -> dict[str, Any]:
        values = {name: getattr(record, name) for name in self.field_names}
        for name, convert in self.to_avro:
            values[name] = convert(values[name])
        return values


@dataclasses.dataclass(frozen=True)
class Registry:
    """Every shipped schema version, indexed the ways the hot paths need."""

    versions: tuple[SchemaVersion, ...]  # sorted by (name, version)
    by_fingerprint: Mapping[bytes, SchemaVersion]
    latest: Mapping[str, SchemaVersion]  # by name
    latest_by_type: Mapping[type, SchemaVersion]
    mappings: Mapping[str, RecordMapping]  # by name, for the latest version


def _int_range(field_type: Any) -> tuple[int, int] | None:
    if isinstance(field_type, list):  # ["null", T]: None passes, T is checked
        field_type = next((t for t in field_type if t != "null"), None)
    if isinstance(field_type, str) and field_type in _INT_RANGES:
        return _INT_RANGES[field_type]
    return None


def _range_checks(schema: Mapping[str, Any], arrays: bool) -> tuple[RangeCheck, ...]:
    checks = []
    for field in schema["fields"]:
        field_type = field["type"]
        is_array = isinstance(field_type, dict) and field_type.get("type") == "array"
        bounds = _int_range(field_type["items"] if is_array else field_type)
        if bounds is not None and is_array == arrays:
            checks.append((field["name"], *bounds))
    return tuple(checks)


def _int_check(low: int, high: int) -> ValueCheck:
    return lambda value: type(value) is int and low <= value <= high


def _int_array_check(low: int, high: int) -> ValueCheck:
    # map(type)/min/max run in C: this is most of the encode-side check for a codec chunk
    def check(value: Any) -> bool:
        if type(value) not in (list, tuple):
            return False
        if not value:
            return True
        return set(map(type, value)) == {int} and low <= min(value) <= max(value) <= high

    return check


def _nullable(check: ValueCheck) -> ValueCheck:
    return lambda value: value is None or check(value)


def _exact_type(python_type: type) -> ValueCheck:
    return lambda value: type(value) is python_type


_PRIMITIVE_CHECKS: dict[str, ValueCheck] = {
    "int": _int_check(*_INT_RANGES["int"]),
    "long": _int_check(*_INT_RANGES["long"]),
    "boolean": _exact_type(bool),
    "string": _exact_type(str),
    "bytes": _exact_type(bytes),
}


def _defer(value: Any) -> bool:
    return False  # a construct _value_check does not know: fastavro's validator decides


def _value_check(avro_type: Any) -> ValueCheck:
    if isinstance(avro_type, str):
        return _PRIMITIVE_CHECKS.get(avro_type, _defer)
    if isinstance(avro_type, list) and len(avro_type) == 2 and avro_type[0] == "null":
        return _nullable(_value_check(avro_type[1]))
    kind = avro_type.get("type") if isinstance(avro_type, dict) else None
    items = avro_type.get("items") if kind == "array" else None
    if isinstance(items, str) and items in _INT_RANGES:
        return _int_array_check(*_INT_RANGES[items])
    if kind == "enum":
        symbols = frozenset(avro_type["symbols"])
        return lambda value: type(value) is str and value in symbols
    return _defer


def _load_version(path: Path, name: str, version: int) -> SchemaVersion:
    text = path.read_text(encoding="utf-8")
    schema = json.loads(text)
    parsed = parse_schema(schema)
    canonical = to_parsing_canonical_form(parsed)
    return SchemaVersion(
        name=name,
        version=version,
        record_type=RECORD_TYPES[name],
        fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
        canonical_form=canonical,
        text=text,
        parsed=parsed,
        scalar_ranges=_range_checks(schema, arrays=False),
        array_ranges=_range_checks(schema, arrays=True),
        value_checks=tuple((f["name"], _value_check(f["type"])) for f in schema["fields"]),
    )


def _scan(directory: Path) -> list[SchemaVersion]:
    versions = []
    for path in sorted(directory.glob("*.avsc")):
        match = _FILE_NAME.match(path.name)
        if match is None or match["name"] not in RECORD_TYPES:
            raise WireError(f"unexpected schema file {path.name}: want <name>.v<N>.avsc")
        versions.append(_load_version(path, match["name"], int(match["version"])))
    return sorted(versions, key=lambda v: (v.name, v.version))


def _check_complete(versions: list[SchemaVersion]) -> None:
    """Each record type has versions 1..N with no hole, and no two files share a fingerprint."""
    for name in RECORD_TYPES:
        numbers = [v.version for v in versions if v.name == name]
        if numbers != list(range(1, len(numbers) + 1)) or not numbers:
            raise WireError(f"schema versions of {name} must be 1..N, found {numbers}")
    if len({v.fingerprint for v in versions}) != len(versions):
        raise WireError("two schema files have the same canonical form (same fingerprint)")


def _check_fields(latest: SchemaVersion) -> None:
    """The latest schema has exactly the record's fields: decode fills every slot from it."""
    expected_name = f"codeclog.{latest.record_type.__name__}"
    if latest.parsed["name"] != expected_name:
        raise WireError(
            f"{latest.label} must be named {expected_name}, not {latest.parsed['name']}"
        )
    record_fields = {f.name for f in dataclasses.fields(latest.record_type)}
    schema_fields = {f["name"] for f in latest.parsed["fields"]}
    if record_fields != schema_fields:
        diff = sorted(record_fields ^ schema_fields)
        raise WireError(f"{latest.label} and {latest.record_type.__name__} differ in {diff}")


# Fields whose Python form differs from fastavro's: arrays are tuples, enums their Python enums.
_CONVERTERS: dict[str, tuple[tuple[str, Callable[[Any], Any]], ...]] = {
    "codec_chunk": (("codes", tuple),),
    "control_event": (("kind", ControlKind),),
    "audio_chunk": (("chunk_seqs", tuple),),
    "dead_letter": (),
    "stream_checkpoint": (),
    "payload_envelope": (("entries", lambda items: tuple(map(_entry_from_avro, items))),),
    "handout_mark": (("reason", HandOutEnd),),
    "handout_move": (),
}
# Record value -> Avro value, where that is not the identity (tuples need none: fastavro writes
# any sequence; enums are written as their values).
_TO_AVRO: dict[str, tuple[tuple[str, Callable[[Any], Any]], ...]] = {
    "control_event": (("kind", lambda kind: _enum_value(kind)),),
    "handout_mark": (("reason", lambda reason: _enum_value(reason)),),
    "payload_envelope": (("entries", lambda entries: [_entry_to_avro(e) for e in entries]),),
}
_ENTRY_CONSTRUCT = slot_constructor(PayloadEntry)
_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(PayloadEntry))


def _entry_from_avro(values: dict[str, Any]) -> PayloadEntry:
    values["path"] = tuple(values["path"])
    values["kind"] = PayloadKind(values["kind"])
    values["shape"] = tuple(values["shape"])
    entry: PayloadEntry = _ENTRY_CONSTRUCT(*[values[name] for name in _ENTRY_FIELDS])
    return entry


def _entry_to_avro(entry: Any) -> Any:
    if not isinstance(entry, PayloadEntry):
        return entry  # the validator names what is wrong
    values = {name: getattr(entry, name) for name in _ENTRY_FIELDS}
    values["kind"] = _enum_value(entry.kind)
    return values


def _enum_value(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _mapping(record_type: type[Record], name: str) -> RecordMapping:
    if hasattr(record_type, "__post_init__") or not hasattr(record_type, "__slots__"):
        raise WireError(f"{record_type.__name__} must be a slotted dataclass without __post_init__")
    fields = dataclasses.fields(record_type)
    to_record = _CONVERTERS.get(name, ())
    to_avro = _TO_AVRO.get(name, ())
    return RecordMapping(
        record_type=record_type,
        field_names=tuple(f.name for f in fields),
        to_record=to_record,
        to_avro=to_avro,
        construct=slot_constructor(record_type),
    )


def _check_enum_symbols(latest: SchemaVersion) -> None:
    """Enum fields of the latest schema have exactly the symbols of their Python enum."""
    for name, convert in _CONVERTERS.get(latest.name, ()):
        if isinstance(convert, type) and issubclass(convert, enum.Enum):
            field = next(f for f in latest.parsed["fields"] if f["name"] == name)
            symbols = set(field["type"]["symbols"])
            if symbols != {member.value for member in convert}:
                raise WireError(f"{latest.label}.{name} symbols differ from {convert.__name__}")


def check_folder(directory: Path) -> Registry:
    """Load and check a folder of `<name>.v<N>.avsc` files; WireError names the first problem."""
    versions = _scan(directory)
    _check_complete(versions)
    latest = {v.name: v for v in versions}  # sorted by version, so the last one wins
    for version in latest.values():
        _check_fields(version)
        _check_enum_symbols(version)
    return Registry(
        versions=tuple(versions),
        by_fingerprint={v.fingerprint: v for v in versions},
        latest=latest,
        latest_by_type={v.record_type: v for v in latest.values()},
        mappings={name: _mapping(RECORD_TYPES[name], name) for name in latest},
    )


@functools.cache
def registry() -> Registry:
    """The shipped schemas (`schemas/avro/`), loaded, checked and parsed once per process."""
    return check_folder(AVRO_DIR)


def fingerprint_of(record_type: type[Record]) -> bytes:
    """The 8-byte wire fingerprint of the latest schema of `record_type`."""
    return registry().latest_by_type[record_type].fingerprint


def known_fingerprints() -> dict[str, str]:
    """Every shipped schema: fingerprint as wire-order hex -> "name.vN"."""
    return {v.fingerprint.hex(): v.label for v in registry().versions}


def _version(name: str, version: int) -> SchemaVersion:
    for candidate in registry().versions:
        if candidate.name == name and candidate.version == version:
            return candidate
    raise WireError(
        f"no schema {name}.v{version}; known: {', '.join(known_fingerprints().values())}"
    )


def schema_json(name: str, version: int) -> str:
    """The `.avsc` text of `name` (e.g. "codec_chunk") at `version`, as shipped."""
    return _version(name, version).text


def canonical_form(name: str, version: int) -> str:
    """The Parsing Canonical Form of `name` at `version` (what captures should pin)."""
    return _version(name, version).canonical_form


def latest_version(name: str) -> int:
    return registry().latest[name].version


def fingerprint_table() -> str:
    """A Markdown table of every shipped schema version and its fingerprint."""
    lines = ["| schema | record | fingerprint (wire order, hex) | latest |", "|---|---|---|---|"]
    for v in registry().versions:
        latest = "yes" if registry().latest[v.name] is v else ""
        record = v.record_type.__name__
        lines.append(f"| `{v.label}` | {record} | `{v.fingerprint.hex()}` | {latest} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(fingerprint_table())
