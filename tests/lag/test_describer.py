"""The group describer (codeclog.lag.describer): librdkafka aborting on a coordinator request
(#4605) costs a child process and one measurement's group state, never the lag exporter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

from codeclog.lag.describer import GroupDescriber
from codeclog.lag.measure import LagMeasurer
from tests.lag.describer_children import abort_first_then_answer, never_answer


def test_a_child_that_aborts_costs_one_answer_and_the_next_child_answers(tmp_path: Path) -> None:
    """Issue 43's hour-long soak: the exporter died (SIGABRT in librdkafka,
    `eonce->refcnt > 0`) two minutes after a transaction-coordinator cut, with the request
    timeout that was to prevent it. The request now runs in a child: its abort is an unknown
    group state for one measurement, counted; the next question starts a new child."""
    describer = GroupDescriber({"marker": str(tmp_path / "m")}, 30.0, abort_first_then_answer)
    try:
        assert describer.ask("g", "t") is None and describer.deaths == 1
        assert describer.ask("g", "t") == ("ok", "STABLE", 2, {0, 1})
        assert describer.deaths == 1
    finally:
        describer.close()


def test_a_question_waiting_on_a_coordinator_is_not_asked_again(tmp_path: Path) -> None:
    log = tmp_path / "asked"
    describer = GroupDescriber({"log": str(log)}, 0.2, never_answer)
    try:
        assert describer.ask("g", "t") is None
        assert describer.ask("g", "t") is None
        assert describer.ask("other", "t") is None
    finally:
        describer.close()
    assert log.read_text().splitlines() == ["('g', 't')"]


class _Answers:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def ask(self, group: str, topic: str) -> Any:
        return self.answer

    def close(self) -> None:
        return None


def test_the_measurer_reads_the_childs_answers() -> None:
    measurer = LagMeasurer({"bootstrap.servers": "127.0.0.1:1"}, timeout_s=0.1)
    try:
        cases = [
            (("ok", "STABLE", 2, {0, 3}), ("STABLE", 2, {0, 3})),
            (("error", KafkaError.GROUP_ID_NOT_FOUND, "not found"), ("DEAD", 0, set())),
            (("error", KafkaError._TIMED_OUT, "timed out"), (None, None, None)),
            (None, (None, None, None)),
        ]
        for answer, expected in cases:
            measurer._describer = _Answers(answer)  # type: ignore[assignment]
            assert measurer.describe("g", "t") == expected
    finally:
        measurer.close()
