"""`codeclog talk`: arguments, errors users can cause, and a real run on the broker."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from codeclog.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sessions", "0"], "sessions must be in 1..100000"),
        (["--seconds", "-1"], "seconds must be in"),
        (["--linger-ms", "-3"], "linger_ms must be in"),
    ],
)
def test_bad_arguments_are_one_sentence_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["talk", "--bootstrap", "127.0.0.1:9", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("codeclog talk: ") and message in err
    assert "Traceback" not in err


def test_unreachable_cluster_is_one_sentence_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["talk", "--bootstrap", "127.0.0.1:9", "--connect-timeout-s", "1", "--seconds", "1"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1
    assert "no answer from the Kafka cluster at 127.0.0.1:9" in err
    assert err.count("\n") == 1


def test_undelivered_counts_every_record_that_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every delivery times out (a broker gone mid-run): the JSON's `undelivered` agrees with
    `failed` (it used to say 0 next to "failed": 21, counting only what the final flush left)."""
    from confluent_kafka import KafkaError

    from codeclog.cli.commands import talk
    from codeclog.producers.publisher import ChunkPublisher
    from tests.producers.test_publisher_fake_producer import FakeProducer

    def failing(settings: dict[str, object]) -> FakeProducer:
        producer = FakeProducer(settings)
        producer.outcome = KafkaError(KafkaError._MSG_TIMED_OUT)
        return producer

    monkeypatch.setattr(talk, "topic_partition_count", lambda *a, **k: 2)
    monkeypatch.setattr(
        talk, "ChunkPublisher", lambda c, p: ChunkPublisher(c, p, producer_factory=failing)
    )
    argv = ["talk", "--bootstrap", "127.0.0.1:9", "--seconds", "2", "--json", "--quiet"]
    assert main(argv) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["delivered"] == 0 and summary["failed"] == summary["published"] > 0
    assert summary["undelivered"] == summary["failed"]


def test_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["talk", "--help"])
    out = capsys.readouterr().out
    for needle in ("--realtime", "--seed", "examples:", "topics create", "exit codes"):
        assert needle in out


@pytest.mark.kafka
def test_talk_publishes_and_reports_json(
    kafka_bootstrap: str, unique_name: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    topic = unique_name("talk")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    argv = ["talk", "--bootstrap", kafka_bootstrap, "--topic", topic, "--json"]
    argv += ["--sessions", "3", "--seconds", "8", "--seed", "5"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["failed"] == 0 and first["undelivered"] == 0
    assert first["delivered"] == first["published"] == first["chunks"] + first["control_events"]
    assert first["sessions"] == 3 and first["frames"] > 0
    assert first["audio_seconds"] == pytest.approx(first["frames"] * 0.04)
    same_seed = ("chunks", "control_events", "frames", "turns", "barge_ins", "steps")
    assert {k: first[k] for k in same_seed} == {k: second[k] for k in same_seed}


@pytest.mark.kafka
def test_talk_refuses_a_missing_topic(
    kafka_bootstrap: str, unique_name: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    topic = unique_name("absent")
    code = main(["talk", "--bootstrap", kafka_bootstrap, "--topic", topic, "--seconds", "1"])
    assert code == 1
    assert "run `codeclog topics create` first" in capsys.readouterr().err
