"""Capture logic without a broker: bounds, span planning, and the drain loop on a fake consumer
that behaves like a read_committed one (commit markers and aborted records take offsets but are
never delivered; position() steps over them)."""

from __future__ import annotations

import io
import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from codeclog.replay.capture import (
    Bound,
    BoundKind,
    bound_offsets,
    client_versions,
    key_filter,
    parse_bound,
    plan_spans,
)
from codeclog.replay.capture_drain import Drainer, record_from_message
from codeclog.replay.capture_format import (
    CapturedRecord,
    CaptureMetadata,
    CaptureReader,
    CaptureWriter,
    PartitionSpan,
    TimestampType,
)
from codeclog.replay.errors import BoundError, CaptureError
from tests.fake_kafka import FakeMessage

# --- header ----------------------------------------------------------------------------------


def test_client_versions_are_whole_version_strings() -> None:
    """`client.versions` recorded {"confluent_kafka": "2"}: the first character of "2.16.1"."""
    import importlib.metadata

    import confluent_kafka

    versions = client_versions()
    assert versions["confluent_kafka"] == importlib.metadata.version("confluent-kafka")
    assert versions["confluent_kafka"].count(".") >= 2  # major.minor.patch, never one digit
    assert versions["librdkafka"] == confluent_kafka.libversion()[0]


# --- bounds ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Bound(BoundKind.OFFSET, 0)),
        ("1234", Bound(BoundKind.OFFSET, 1234)),
        (" 42 ", Bound(BoundKind.OFFSET, 42)),
        ("1767225600000ms", Bound(BoundKind.TIME_MS, 1_767_225_600_000)),
        ("2026-01-01T00:00:00Z", Bound(BoundKind.TIME_MS, 1_767_225_600_000)),
        ("2026-01-01T00:00:00", Bound(BoundKind.TIME_MS, 1_767_225_600_000)),  # UTC by default
        ("2026-01-01T02:00:00+02:00", Bound(BoundKind.TIME_MS, 1_767_225_600_000)),
        ("2026-01-01T00:00:00.250Z", Bound(BoundKind.TIME_MS, 1_767_225_600_250)),
    ],
)
def test_parse_bound(text: str, expected: Bound) -> None:
    assert parse_bound(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "12ms34", "yesterday", "ms", "1.5"])
def test_parse_bound_refuses_anything_else(text: str) -> None:
    with pytest.raises(BoundError, match="is not an offset"):
        parse_bound(text)


def test_plan_spans_clamps_to_the_log() -> None:
    spans = plan_spans(
        [1, 0],
        earliest={0: 5, 1: 0},
        latest={0: 100, 1: 10},
        start_offsets={0: 2, 1: 4},  # below the earliest offset on 0: start there
        until_offsets={0: 50, 1: 99},  # past the LSO on 1: stop at the LSO
    )
    assert spans == (PartitionSpan(0, 5, 50), PartitionSpan(1, 4, 10))


def test_plan_spans_never_inverts_a_span() -> None:
    spans = plan_spans([0], {0: 0}, {0: 10}, {0: 20}, None)
    assert spans == (PartitionSpan(0, 20, 20),)


def test_bound_offsets_maps_a_time_past_the_last_record_to_the_lso() -> None:
    def lookup(ts_ms: int) -> dict[int, int]:
        assert ts_ms == 77
        return {0: 3, 1: -1}

    bound = Bound(BoundKind.TIME_MS, 77)
    assert bound_offsets(bound, [0, 1], {0: 9, 1: 12}, lookup) == {0: 3, 1: 12}
    assert bound_offsets(Bound(BoundKind.OFFSET, 4), [0, 1], {0: 9, 1: 12}, lookup) == {0: 4, 1: 4}
    assert bound_offsets(None, [0], {0: 9}, lookup) is None


# --- a fake read_committed consumer ----------------------------------------------------------

MARKER = "marker"  # a commit marker: takes an offset, never delivered
ABORTED = "aborted"  # a record of an aborted transaction: invisible to read_committed


class FakeConsumer:
    """Partition logs of entries: (key, value) records, MARKER or ABORTED."""

    def __init__(self, topic: str, logs: dict[int, list[Any]], fetch_max: int = 3) -> None:
        self.topic = topic
        self.logs = logs
        self.fetch_max = fetch_max
        self.next: dict[int, int] = {}
        self.paused: set[int] = set()
        self.consume_calls = 0

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.next = {tp.partition: tp.offset for tp in partitions}

    def consume(self, num_messages: int, timeout: float) -> list[FakeMessage]:
        self.consume_calls += 1
        out: list[FakeMessage] = []
        for p in sorted(self.next):
            if p not in self.paused:
                out += self._fetch(p, min(num_messages, self.fetch_max))
        return out

    def _fetch(self, p: int, limit: int) -> list[FakeMessage]:
        out = []
        log = self.logs[p]
        while self.next[p] < len(log) and len(out) < limit:
            entry = log[self.next[p]]
            if entry not in (MARKER, ABORTED):
                out.append(FakeMessage(self.topic, p, self.next[p], *entry))
            self.next[p] += 1  # position steps over markers and aborted records
        return out

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(self.topic, tp.partition, self.next[tp.partition]) for tp in partitions
        ]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in partitions}


def _metadata(spans: tuple[PartitionSpan, ...]) -> CaptureMetadata:
    return CaptureMetadata(
        topic="t", partition_count=2, spans=spans, cluster_id="c", created_at_ms=0
    )


def _drain(
    consumer: FakeConsumer, spans: tuple[PartitionSpan, ...], requests: Sequence[str] = ()
) -> tuple[int, int, list[CapturedRecord]]:
    buffer = io.BytesIO()
    writer = CaptureWriter(buffer, _metadata(spans))
    ticks = itertools.count()
    drainer = Drainer(
        consumer,
        "t",
        writer,
        key_filter(requests),
        lambda: 42,
        lambda: float(next(ticks)),
        idle_timeout_s=5.0,
    )
    read, written = drainer.run(spans)
    writer.flush()
    records = list(CaptureReader(io.BytesIO(buffer.getvalue())).records())
    return read, written, records


def test_drain_records_offsets_as_observed_and_ends_on_trailing_markers() -> None:
    logs = {
        0: [(b"a", b"0"), (b"a", b"1"), MARKER, ABORTED, ABORTED, MARKER, (b"a", b"6"), MARKER],
        1: [(b"b", b"0"), MARKER],
    }
    consumer = FakeConsumer("t", logs)
    spans = (PartitionSpan(0, 0, 8), PartitionSpan(1, 0, 2))  # ends are LSOs: after the markers
    read, written, records = _drain(consumer, spans)
    assert (read, written) == (4, 4)
    assert sorted((r.partition, r.offset) for r in records) == [(0, 0), (0, 1), (0, 6), (1, 0)]
    assert {r.observed_at_ms for r in records} == {42}
    assert consumer.paused == {0, 1}


def test_drain_ignores_records_appended_after_the_capture_started() -> None:
    logs = {0: [(b"a", b"0"), (b"a", b"1"), (b"late", b"2"), (b"late", b"3")]}
    read, _, records = _drain(FakeConsumer("t", logs, fetch_max=10), (PartitionSpan(0, 0, 2),))
    assert read == 2
    assert [r.key for r in records] == [b"a", b"a"]


def test_drain_starts_at_the_span_start_and_skips_empty_spans() -> None:
    logs = {0: [(b"a", b"0"), (b"a", b"1"), (b"a", b"2")], 1: [(b"b", b"0")]}
    consumer = FakeConsumer("t", logs)
    _, _, records = _drain(consumer, (PartitionSpan(0, 1, 3), PartitionSpan(1, 1, 1)))
    assert [(r.partition, r.offset) for r in records] == [(0, 1), (0, 2)]
    assert set(consumer.next) == {0}  # the empty span was never assigned


def test_drain_filters_by_request_after_reading() -> None:
    logs = {0: [(b"a", b"0"), (b"b", b"1"), (None, b"2"), (b"c", b"3")]}
    read, written, records = _drain(FakeConsumer("t", logs), (PartitionSpan(0, 0, 4),), ["b", "c"])
    assert (read, written) == (4, 2)
    assert [(r.key, r.offset) for r in records] == [(b"b", 1), (b"c", 3)]


def test_drain_gives_up_with_a_clear_error_when_nothing_advances() -> None:
    logs = {0: [(b"a", b"0")]}  # the span claims 5 offsets the log does not have
    with pytest.raises(CaptureError, match="no progress for 5 s on partition"):
        _drain(FakeConsumer("t", logs), (PartitionSpan(0, 0, 5),))


def test_record_from_message_keeps_everything() -> None:
    value = b"\xc3\x01ABCDEFGHbody"
    record = record_from_message(FakeMessage("t", 2, 9, b"k", value), observed_at_ms=7)
    assert record.value == value
    assert record.schema_fingerprint == b"ABCDEFGH"
    assert (record.topic, record.partition, record.offset, record.key) == ("t", 2, 9, b"k")
    assert (record.timestamp_ms, record.timestamp_type) == (1009, TimestampType.CREATE_TIME)
    assert record.headers[0].key == "h" and record.headers[0].value == b"1"
    assert (record.observed_at_ms, record.leader_epoch) == (7, 3)


def test_progress_line_is_quiet_at_first_then_shows_the_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from codeclog.cli.progress import StderrProgress

    clock = iter([0.0, 0.5, 10.0, 10.1])
    progress = StderrProgress(lambda: next(clock), "capture", "offsets", "records written")
    progress.update(1, 4, 1)  # at 0.5 s: still quiet
    progress.update(2, 4, 1)  # at 10 s: shown
    progress.update(3, 4, 2)  # at 10.1 s: too soon to redraw
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "capture: [###############               ]  50.0% of 4 offsets, 1 records written"
    ]
