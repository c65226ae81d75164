"""An independent audit of the audio and dead-letter topics: the .avsc files, confluent-kafka and
fastavro only, none of the pipeline's code (no `schemas.wire`, no `consumers`)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from fastavro import parse_schema, schemaless_reader
from fastavro.schema import fingerprint, to_parsing_canonical_form

AVRO_DIR = Path(__file__).resolve().parents[1] / "schemas" / "avro"  # codeclog/schemas/avro
MARKER = b"\xc3\x01"  # Avro single-object encoding, version 1
HEADER = len(MARKER) + 8  # marker + CRC-64-AVRO fingerprint (little-endian)
READ_IDLE_S = 15.0  # a partition that sends nothing this long while not at its end: give up

WindowKey = tuple[str, int, int]  # (request id, cache epoch, window index)


class AuditError(Exception):
    """The topic could not be read to its end."""


def shipped_schemas() -> dict[bytes, tuple[str, Any]]:
    """Fingerprint -> (file stem, parsed schema) of every shipped .avsc file."""
    out: dict[bytes, tuple[str, Any]] = {}
    for path in sorted(AVRO_DIR.glob("*.avsc")):
        text = path.read_text()
        canonical = to_parsing_canonical_form(json.loads(text))
        out[bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))] = (
            path.name.split(".")[0],
            parse_schema(json.loads(text)),
        )
    return out


def decode(value: bytes, schemas: dict[bytes, tuple[str, Any]]) -> tuple[str, dict[str, Any]]:
    """(record type, fields) of one single-object-encoded value."""
    if not value.startswith(MARKER) or len(value) < HEADER:
        raise ValueError("not an Avro single-object value")
    found = schemas.get(bytes(value[len(MARKER) : HEADER]))
    if found is None:
        raise ValueError("unknown writer schema")
    name, schema = found
    body = io.BytesIO(value[HEADER:])
    fields = schemaless_reader(body, schema, schema)
    if body.tell() != len(value) - HEADER:
        raise ValueError("trailing bytes")
    return name, dict(fields)  # type: ignore[arg-type]


def read_values(client: dict[str, str], topic: str) -> list[bytes]:
    """Every committed value of `topic`, all partitions, up to their ends."""
    return [value for _, _, value in read_records(client, topic)]


def read_records(
    client: dict[str, str], topic: str, isolation: str = "read_committed"
) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record of `topic` a reader of `isolation` sees, all
    partitions, up to their ends (the history checker reads both isolations)."""
    consumer = Consumer(
        {
            **client,
            "group.id": "codeclog-audit",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "log_level": 2,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        waiting, records = set(partitions), []
        idle = 0.0
        while waiting:
            messages = consumer.consume(500, 0.5)
            idle = 0.0 if messages else idle + 0.5
            if idle > READ_IDLE_S:
                raise AuditError(f"{topic}: partitions {sorted(waiting)} not read to their end")
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        waiting.discard(message.partition())
                    continue
                records.append(
                    (message.partition() or 0, message.offset() or 0, message.value() or b"")
                )
        return records
    finally:
        consumer.close()


@dataclasses.dataclass
class AuditReport:
    windows: dict[WindowKey, str] = dataclasses.field(default_factory=dict)  # -> sha256
    duplicated: list[WindowKey] = dataclasses.field(default_factory=list)
    corrupt: list[WindowKey] = dataclasses.field(default_factory=list)
    gaps: list[str] = dataclasses.field(default_factory=list)
    undecodable: int = 0
    dead_letters: int = 0

    @property
    def ok(self) -> bool:
        return not (self.duplicated or self.corrupt or self.gaps or self.undecodable)

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "windows": len(self.windows),
            "duplicated": len(self.duplicated),
            "corrupt": len(self.corrupt),
            "gaps": self.gaps[:5],
            "undecodable": self.undecodable,
            "dead_letters": self.dead_letters,
        }


def audit(client: dict[str, str], audio_topic: str, dlq_topic: str) -> AuditReport:
    schemas = shipped_schemas()
    report = AuditReport()
    streams: dict[tuple[str, int], dict[int, tuple[int, int]]] = defaultdict(dict)
    for value in read_values(client, audio_topic):
        try:
            name, chunk = decode(value, schemas)
        except Exception:
            report.undecodable += 1
            continue
        if name != "audio_chunk":
            report.undecodable += 1
            continue
        key = (chunk["request_id"], chunk["cache_epoch"], chunk["window_index"])
        pcm: bytes = chunk["pcm_s16le"]
        if key in report.windows:
            report.duplicated.append(key)
            continue
        report.windows[key] = chunk["sha256"]
        if hashlib.sha256(pcm).hexdigest() != chunk["sha256"]:
            report.corrupt.append(key)
        streams[key[:2]][key[2]] = (chunk["sample_offset"], len(pcm) // 2)
    for (rid, epoch), by_index in sorted(streams.items()):
        if sorted(by_index) != list(range(len(by_index))):
            report.gaps.append(f"{rid} epoch {epoch}: window indices {sorted(by_index)}")
            continue
        expected_offset = 0
        for index in range(len(by_index)):
            offset, samples = by_index[index]
            if offset != expected_offset:
                report.gaps.append(f"{rid} epoch {epoch} window {index}: offset {offset}")
                break
            expected_offset += samples
    report.dead_letters = len(read_values(client, dlq_topic))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--audio", default="codec.audio")
    parser.add_argument("--dlq", default="codec.dlq")
    args = parser.parse_args()
    try:
        report = audit({"bootstrap.servers": args.bootstrap}, args.audio, args.dlq)
    except (AuditError, KeyError) as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.summary()))
    return 0 if report.ok and not report.dead_letters else 1


if __name__ == "__main__":
    sys.exit(main())
