"""Whose checkpoints a group restores (docs/operating.md, "How recovery works"): a v2
checkpoint names its group; a v1 checkpoint (written before groups were recorded) counts only
for the group one of whose members wrote it (producer id `<group>-<instance>`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.consumers.member.progress import belongs_to, progress_key, read_checkpoints
from codeclog.schemas import wire
from codeclog.schemas.records import StreamCheckpoint
from tests.schemas.test_wire_evolution import V1_GOLDEN_CHECKPOINT  # by codeclog-vocoder-0

BASE = StreamCheckpoint("r", "codec.chunks", 0, False, 0, -1, 3, 1, 960)


def _checkpoint(rid: str, group: str, producer_id: str) -> StreamCheckpoint:
    return dataclasses.replace(BASE, request_id=rid, producer_id=producer_id, consumer_group=group)


@pytest.mark.parametrize(
    ("written_by", "producer_id", "group", "counts"),
    [
        ("g", "g-0", "g", True),
        ("other", "g-0", "g", False),  # v2: the group named, whoever produced it
        ("", "g-1", "g", True),  # v1 by a member of g
        ("", "other-0", "g", False),  # v1 by a member of another group
        ("", "g", "g", False),  # not `<group>-<instance>`
        ("", "gx-0", "g", False),
    ],
)
def test_whose_checkpoint_counts(
    written_by: str, producer_id: str, group: str, counts: bool
) -> None:
    assert belongs_to(_checkpoint("r", written_by, producer_id), group) is counts


@pytest.mark.kafka
def test_a_group_reads_its_own_checkpoints_and_its_members_v1_ones(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("progress")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    ours, theirs = "codeclog-vocoder", "other"  # the golden v1 record's writer is ours
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for key, value in [
        (progress_key(ours, "a"), wire.encode(_checkpoint("a", ours, f"{ours}-0"))),
        (progress_key(theirs, "b"), wire.encode(_checkpoint("b", theirs, f"{theirs}-0"))),
        ("r1", V1_GOLDEN_CHECKPOINT),  # stream_checkpoint.v1: no group
    ]:
        producer.produce(topic, key=key.encode(), value=value, partition=0)
    assert producer.flush(30) == 0

    def requests(group: str) -> set[str]:
        found = read_checkpoints({"bootstrap.servers": kafka_bootstrap}, topic, group, [0], 30)
        return set(found[0])

    assert requests(ours) == {"a", "r1"}
    assert requests(theirs) == {"b"}


@pytest.mark.kafka
def test_a_transaction_left_open_never_hides_the_newer_checkpoints_behind_it(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """A member that lost its partitions mid-transaction (cut from its group coordinator, or
    killed) leaves its transaction open on the progress partition until it is aborted. A
    read_committed reader stops at that transaction (the partition's last stable offset), so
    the checkpoints the new owner committed after it were not read: issue 43's soak restored
    11-second-old checkpoints that way, and six windows went out twice with other bytes and six
    never. The read now ends only when every transaction begun before it is decided: while one
    stays open it gives up (the rebuild is retried), and once it is aborted the newest
    checkpoint is there."""
    from codeclog.kafka.calls import ClusterUnavailableError

    topic = unique_name("progress")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    group = "g"
    client = {"bootstrap.servers": kafka_bootstrap}

    def checkpoint(producer: Producer, windows: int) -> None:
        record = dataclasses.replace(_checkpoint("r", group, f"{group}-0"), windows_emitted=windows)
        producer.produce(
            topic, key=progress_key(group, "r").encode(), value=wire.encode(record), partition=0
        )

    zombie = Producer({**client, "transactional.id": unique_name("zombie")})
    owner = Producer({**client, "transactional.id": unique_name("owner")})
    for producer in (zombie, owner):
        producer.init_transactions(30)
        producer.begin_transaction()
    checkpoint(zombie, 1)  # the old owner's, never committed
    assert zombie.flush(30) == 0
    checkpoint(owner, 7)  # the new owner's, committed
    owner.commit_transaction(30)
    with pytest.raises(ClusterUnavailableError, match="transaction"):
        read_checkpoints(client, topic, group, [0], 2)
    zombie.abort_transaction(30)
    found = read_checkpoints(client, topic, group, [0], 30)
    assert found[0]["r"].windows_emitted == 7
