"""The documented OmniConnector contract, through the interface, on the real broker."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import torch
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.devtools.host import pick_free_port
from codeclog.omni.connector import CodeclogKafkaConnector
from codeclog.omni.failures import ERROR_KEY
from codeclog.omni.minicpmo import minicpmo_payload
from codeclog.testing.upstream_streams import preroll_window
from tests.omni.equality import payload_equal

pytestmark = pytest.mark.kafka
WAIT_S = 60.0


def _topic(bootstrap: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 3, 1)])[name].result(30)
    return name


@pytest.fixture
def pair(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> Iterator[tuple[CodeclogKafkaConnector, CodeclogKafkaConnector]]:
    topic = _topic(kafka_bootstrap, unique_name("omni"))
    base = {"bootstrap": kafka_bootstrap, "topic": topic}
    sender = CodeclogKafkaConnector({**base, "stage_id": 1, "role": "sender"})
    receiver = CodeclogKafkaConnector(
        {**base, "stage_id": 2, "role": "receiver", "group_id": unique_name("recv")}
    )
    yield sender, receiver
    sender.close()
    receiver.close()


def _wait(receiver: CodeclogKafkaConnector, key: str, frm: str = "1", to: str = "2") -> object:
    got = receiver.get_with_deadline(frm, to, key, deadline=time.monotonic() + WAIT_S)
    assert got is not None, receiver.health()
    return got


CHUNK = preroll_window("req_a", (7, 8, 9, 10), llm_output_text_utf8=b"hi")


def test_put_then_get_returns_an_equal_payload_once(
    pair: tuple[CodeclogKafkaConnector, CodeclogKafkaConnector],
) -> None:
    sender, receiver = pair
    codec = minicpmo_payload(CHUNK)
    other = {"hidden": torch.arange(6, dtype=torch.float16).reshape(2, 3), "ids": [1, 2], "t": None}
    ok, size, meta = sender.put("1", "2", "req_a_1_0", codec)
    assert ok and size > 0 and meta is not None and meta["record"] == "codec_chunk"
    ok, _, meta = sender.put("0", "1", "req_a_0_0", other)
    assert ok and meta is not None and meta["record"] == "payload_envelope"

    payload, got_size = _wait(receiver, "req_a_1_0")  # type: ignore[misc]
    assert payload_equal(payload, codec) and got_size == size
    assert payload_equal(_wait(receiver, "req_a_0_0", "0", "1")[0], other)  # type: ignore[index]
    assert receiver.get("1", "2", "req_a_1_0") is None  # handed out once
    health = receiver.health()
    assert health["gets"] == 2 and health["failures"] == 0 and health["status"] == "ok"
    assert sender.health()["puts"] == 2


def test_a_copy_put_after_the_first_get_is_dropped_and_counted(
    pair: tuple[CodeclogKafkaConnector, CodeclogKafkaConnector],
) -> None:
    sender, receiver = pair
    assert sender.put("1", "2", "dup_1_0", {"v": "first"})[0]
    assert _wait(receiver, "dup_1_0")[0] == {"v": "first"}  # type: ignore[index]
    assert sender.put("1", "2", "dup_1_0", {"v": "copy"})[0]  # a retry that landed twice
    assert sender.put("1", "2", "dup_1_1", {"v": "next"})[0]  # same request: same partition
    assert _wait(receiver, "dup_1_1")[0] == {"v": "next"}  # type: ignore[index]
    # the copy sits before dup_1_1 in its partition, so it was read by now
    assert receiver.get("1", "2", "dup_1_0") is None
    health = receiver.health()
    assert health.get("redelivered") == 1 and health["index_entries"] == 0, health


def _committed(bootstrap: str, group: str, topic: str, partition: int) -> int:
    """The group's committed offset of a partition once it has one (the receiver commits every
    second), else -1001 after WAIT_S."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            [tp] = reader.committed([TopicPartition(topic, partition)], timeout=10)
            if tp.offset >= 0 or time.monotonic() > deadline:
                return int(tp.offset)
            time.sleep(0.2)
    finally:
        reader.close()


def test_a_restarted_receiver_gets_what_it_had_not_handed_out(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = _topic(kafka_bootstrap, unique_name("omni"))
    base = {"bootstrap": kafka_bootstrap, "topic": topic}
    receiving = {**base, "stage_id": 2, "group_id": unique_name("recv")}
    with CodeclogKafkaConnector({**base, "stage_id": 1}) as sender:
        ok, _, waiting = sender.put("1", "2", "w_1_0", {"k": 0})
        assert ok and waiting is not None
        assert sender.put("1", "2", "w_1_1", {"k": 1})[0]  # same request: same partition
    with CodeclogKafkaConnector(receiving) as receiver:
        assert _wait(receiver, "w_1_1")[0] == {"k": 1}  # w_1_0 was read before it and waits
        group, partition = receiver.group_id, waiting["partition"]
        assert _committed(kafka_bootstrap, group, topic, partition) == waiting["offset"]
    with CodeclogKafkaConnector(receiving) as restarted:
        assert _wait(restarted, "w_1_0")[0] == {"k": 0}


def test_get_before_put_is_none_and_keys_never_collide(
    pair: tuple[CodeclogKafkaConnector, CodeclogKafkaConnector],
) -> None:
    sender, receiver = pair
    assert receiver.get("1", "2", "r_1_0") is None
    puts = {
        ("1", "2", "r_1_0"): {"v": 1},
        ("1", "2", "r_1_1"): {"v": 2},
        ("1", "2", "r2_1_0"): {"v": 3},
        ("0", "1", "r_1_0"): {"v": 4},  # the same key on another edge
    }
    for (frm, to, key), data in puts.items():
        assert sender.put(frm, to, key, data)[0]
    for (frm, to, key), data in puts.items():
        assert _wait(receiver, key, frm, to)[0] == data  # type: ignore[index]


def test_get_with_deadline_honours_the_deadline(
    pair: tuple[CodeclogKafkaConnector, CodeclogKafkaConnector],
) -> None:
    _sender, receiver = pair
    receiver.get("1", "2", "warm_1_0")  # starts the consumer
    start = time.monotonic()
    assert receiver.get_with_deadline("1", "2", "never_1_0", deadline=start + 0.5) is None
    assert 0.45 <= time.monotonic() - start < 2.0
    start = time.monotonic()
    assert receiver.get_with_deadline("1", "2", "never_1_0", deadline=start - 1) is None
    assert time.monotonic() - start < 0.5


def test_cleanup_frees_a_request_and_close_is_idempotent(
    pair: tuple[CodeclogKafkaConnector, CodeclogKafkaConnector],
) -> None:
    sender, receiver = pair
    for i in range(3):
        assert sender.put("1", "2", f"gone_1_{i}", {"i": i})[0]
    assert sender.put("1", "2", "kept_1_0", {"i": 9})[0]
    assert _wait(receiver, "kept_1_0")[0] == {"i": 9}  # type: ignore[index]
    deadline = time.monotonic() + WAIT_S
    while receiver.health()["index_entries"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert receiver.cleanup("gone") is True
    assert receiver.health()["index_entries"] == 0
    assert receiver.get("1", "2", "gone_1_0") is None
    receiver.close()
    receiver.close()
    assert receiver.health()["status"] == "closed"
    assert receiver.put("1", "2", "late_1_0", {}) == (False, 0, None)


def test_put_never_raises_when_the_broker_is_down() -> None:
    dead = f"127.0.0.1:{pick_free_port()}"
    connector = CodeclogKafkaConnector({"bootstrap": dead, "delivery_timeout_ms": 1500})
    start = time.monotonic()
    assert connector.put("1", "2", "r_1_0", minicpmo_payload(CHUNK)) == (False, 0, None)
    assert connector.put("1", "2", "r_1_1", {"x": object()}) == (False, 0, None)  # unsendable
    assert time.monotonic() - start < 15
    health = connector.health()
    assert health["put_failures"] == 2 and health["last_error"]
    connector.close()
    connector.close()


def test_a_topic_created_after_the_receiver_started_is_not_a_failure(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """librdkafka tells a consumer subscribed to a topic it has no metadata for yet (just
    created, or not yet) that it is unknown, and retries: the receiver counts and tells it,
    and stays healthy (it counted a failure, and the tier's health checks failed)."""
    name = unique_name("late")
    base = {"bootstrap": kafka_bootstrap, "topic": name}
    with CodeclogKafkaConnector(
        {**base, "stage_id": 2, "role": "receiver", "group_id": unique_name("recv")}
    ) as receiver:
        deadline = time.monotonic() + WAIT_S
        while not receiver.health().get("consume_errors") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert receiver.health().get("consume_errors"), receiver.health()
        _topic(kafka_bootstrap, name)
        with CodeclogKafkaConnector({**base, "stage_id": 1, "role": "sender"}) as sender:
            assert sender.put("1", "2", "late_1_0", {"v": 1})[0]
        assert _wait(receiver, "late_1_0")[0] == {"v": 1}  # type: ignore[index]
        health = receiver.health()
        assert health["failures"] == 0 and health["status"] == "ok", health


def _ended(payload: object) -> str:
    """The reason a failure terminal carries ("" for any other payload)."""
    meta = payload.get("meta", {}) if isinstance(payload, dict) else {}
    finished = meta.get("finished")
    if not (isinstance(finished, torch.Tensor) and bool(finished.item())):
        return ""
    return str(meta.get(ERROR_KEY, ""))


def test_a_request_waited_on_past_the_bound_ends_with_a_failure_terminal(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """Without an adapter bound to it (outside vLLM), the receiver ends a request whose talker
    went silent with a terminal payload in the adapter's end-marker shape, with the reason."""
    topic = _topic(kafka_bootstrap, unique_name("omni"))
    config = {"bootstrap": kafka_bootstrap, "topic": topic, "stage_id": 2, "request_wait_s": 1}
    with CodeclogKafkaConnector(
        {**config, "role": "receiver", "group_id": unique_name("recv")}
    ) as receiver:
        started = time.monotonic()
        got = None
        while got is None and time.monotonic() - started < WAIT_S:
            got = receiver.get("1", "2", "silent_1_0")  # asked for, never put
            time.sleep(0.05)
        assert got is not None and "request_wait_s" in _ended(got[0])
        assert time.monotonic() - started >= 1.0
        health = receiver.health()
        assert health["timed_out"] == 1 and list(health["failed_requests"]) == ["silent"]
        assert receiver.get("1", "2", "silent_1_0") is None  # ended: nothing more of it


def test_a_replaced_receiver_hands_out_the_unfinished_request_from_chunk_0_only(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """A receiver hands out w's first chunk and the whole of x; its replacement in the same
    group hands out w again from chunk 0, and refuses x: its end is on the ledger."""
    topic = _topic(kafka_bootstrap, unique_name("omni"))
    base = {"bootstrap": kafka_bootstrap, "topic": topic}
    receiving = {**base, "stage_id": 2, "role": "receiver", "group_id": unique_name("recv")}
    with CodeclogKafkaConnector({**base, "stage_id": 1, "role": "sender"}) as sender:
        for key, payload in (("w_1_0", {"k": 0}), ("w_1_1", {"k": 1}), ("x_1_0", {"k": 2})):
            assert sender.put("1", "2", key, payload)[0]
        end = {"meta": {"finished": torch.tensor(True)}}  # the adapter's end marker
        assert sender.put("1", "2", "x_1_1", end)[0]
    with CodeclogKafkaConnector(receiving) as first:
        assert _wait(first, "w_1_0")[0] == {"k": 0}  # type: ignore[index]
        assert _wait(first, "x_1_0")[0] == {"k": 2}  # type: ignore[index]
        assert _ended(_wait(first, "x_1_1")[0]) == ""  # x's terminal: x ended here
        deadline = time.monotonic() + WAIT_S
        while first.health().get("marks", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    with CodeclogKafkaConnector(receiving) as replacement:
        assert _wait(replacement, "w_1_0")[0] == {"k": 0}  # type: ignore[index]
        assert _wait(replacement, "w_1_1")[0] == {"k": 1}  # type: ignore[index]
        reason = _ended(_wait(replacement, "x_1_0")[0])
        assert "ended on this edge before (finished)" in reason
        health = replacement.health()
        assert health["restored_endings"] >= 1 and health["asked_after_end"] == 1
