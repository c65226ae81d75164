"""The talker hook module: the upstream stage-input-processor signature, never raising."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from confluent_kafka import KafkaError

from codeclog.producers.publisher import DeliveryFailure, PublisherConfig, _failure
from codeclog.producers.vllm_omni import TalkerHook, from_environment
from codeclog.schemas.records import CodecChunk, ControlEvent, ControlKind


class _Publisher:
    def __init__(self, fail_on: int | None = None) -> None:
        self.config = PublisherConfig("codec.chunks", producer_id="talker-test")
        self.records: list[Any] = []
        self.fail_on = fail_on
        self.polls = 0

    def publish(self, record: Any) -> None:
        if self.fail_on is not None and len(self.records) == self.fail_on:
            raise RuntimeError("queue full")
        self.records.append(record)

    def poll(self, _timeout: float = 0.0) -> int:
        self.polls += 1
        return 0

    def close(self, _timeout: float = 10.0) -> None:
        return None


@dataclasses.dataclass
class _Status:
    name: str


class _Request:
    def __init__(self, rid: str, status: str = "RUNNING", finished: bool = False) -> None:
        self.external_req_id = rid
        self.request_id = f"{rid}-internal"
        self.status = _Status(status)
        self._finished = finished

    def is_finished(self) -> bool:
        return self._finished


def _output(ids: list[int]) -> dict[str, Any]:
    return {"codes": {"audio": torch.tensor(ids).reshape(-1, 1)}, "meta": {}}


def test_hook_windows_like_the_upstream_and_returns_none() -> None:
    publisher = _Publisher()
    hook = TalkerHook(publisher)
    request = _Request("r1")
    for step in range(25):
        assert hook(None, _output([step]), request) is None
    assert hook(None, _output([]), _Request("r1", finished=True), is_finished=True) is None
    chunks = [r for r in publisher.records if isinstance(r, CodecChunk)]
    assert [c.chunk_seq for c in chunks] == [0, 1]
    assert chunks[0].codes == (4218, 4218, 4218, *range(25))
    assert chunks[1].last_chunk and chunks[1].codes == (22, 23, 24)
    assert publisher.polls == 26 and not hook.failures_by_request


def test_a_chunk_that_cannot_be_published_fails_its_request_and_nothing_raises() -> None:
    hook = TalkerHook(_Publisher(fail_on=0))
    for step in range(25):
        assert hook(None, _output([step]), _Request("r2")) is None
    assert hook.failures_by_request == {"r2": 1}
    assert hook(None, {"codes": {"audio": [99999]}, "meta": {}}, _Request("r3")) is None
    assert hook(None, None, object()) is None  # type: ignore[arg-type]
    assert hook.failures_by_request["r3"] == 1


def test_an_undelivered_chunk_counts_for_its_request() -> None:
    captured: dict[str, Any] = {}

    def factory(client: Any, config: PublisherConfig, *, on_failure: Any) -> _Publisher:
        captured["on_failure"] = on_failure
        return _Publisher()

    hook = from_environment(factory)
    chunk = CodecChunk("r4", (1,), chunk_seq=3)
    failure: DeliveryFailure = _failure(chunk, KafkaError(KafkaError._MSG_TIMED_OUT))
    captured["on_failure"](failure)
    assert hook.failures_by_request == {"r4": 1}


def _aborts(publisher: _Publisher, rid: str) -> list[ControlEvent]:
    return [
        r
        for r in publisher.records
        if isinstance(r, ControlEvent) and r.kind is ControlKind.ABORT and r.request_id == rid
    ]


def test_an_undelivered_chunk_aborts_its_request_and_drops_its_later_steps() -> None:
    publisher = _Publisher()
    hook = TalkerHook(publisher, clock_ms=lambda: 5)
    for step in range(25):
        hook(None, _output([step]), _Request("r5"))
    first = next(r for r in publisher.records if isinstance(r, CodecChunk))
    hook.record_failure(_failure(first, KafkaError(KafkaError._MSG_TIMED_OUT)))
    published = len(publisher.records)
    for step in range(30):  # the engine keeps generating: nothing more of r5 is published
        hook(None, _output([step]), _Request("r5"))
    assert hook.failures_by_request == {"r5": 1} and hook.failed_requests == 1
    assert hook.dropped_steps == 30
    (abort,) = _aborts(publisher, "r5")  # published on the next step, once
    assert publisher.records[published:] == [abort]
    assert abort.producer_id == "talker-test" and abort.produced_at_ms == 5
    for step in range(25):  # other requests go on
        hook(None, _output([step]), _Request("r6"))
    assert any(isinstance(r, CodecChunk) and r.request_id == "r6" for r in publisher.records)


def test_an_undelivered_abort_is_published_again_until_it_is_delivered() -> None:
    publisher = _Publisher()
    hook = TalkerHook(publisher)
    hook.record_failure(_failure(CodecChunk("r7", (1,)), KafkaError(KafkaError._MSG_TIMED_OUT)))
    hook(None, _output([]), _Request("other"))
    (abort,) = _aborts(publisher, "r7")
    hook.record_failure(_failure(abort, KafkaError(KafkaError._MSG_TIMED_OUT)))  # still down
    assert hook.failures_by_request == {"r7": 1}  # the abort is not a second failure
    hook(None, _output([]), _Request("other"))
    assert len(_aborts(publisher, "r7")) == 2 and hook.aborts_published == 2


def test_an_abort_that_cannot_be_queued_waits_for_the_next_step() -> None:
    publisher = _Publisher(fail_on=0)  # every publish raises (queue full)
    hook = TalkerHook(publisher)
    hook.record_failure(_failure(CodecChunk("r8", (1,)), KafkaError(KafkaError._MSG_TIMED_OUT)))
    assert hook(None, _output([]), _Request("other")) is None
    assert hook.aborts_published == 0
    publisher.fail_on = None
    hook(None, _output([]), _Request("other"))
    assert len(_aborts(publisher, "r8")) == 1
