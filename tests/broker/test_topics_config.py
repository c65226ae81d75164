"""Topic creation and checks, TopicsConfig validation and librdkafka properties parsing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import given
from hypothesis import strategies as st

from codeclog.cli import main
from codeclog.cli.config import read_properties
from codeclog.errors import ConfigError
from codeclog.kafka.topics import (
    CleanupPolicy,
    TopicAction,
    TopicInfo,
    TopicMismatchError,
    TopicSpec,
    check_topic,
    create_topics,
    ensure_topics,
    list_topics,
    replication_for,
    setting_notes,
    topic_specs,
)
from codeclog.topics_config import TopicsConfig
from codeclog.user_files import UserFileError
from tests.topics import fresh_topics

# ----------------------------------------------------------------------------- on the broker


@pytest.mark.kafka
def test_create_is_idempotent_and_makes_the_configured_topics(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    client = {"bootstrap.servers": kafka_bootstrap}
    topics = fresh_topics(unique_name, partitions=3, dlq_partitions=2)
    first = create_topics(client, topics)
    assert [o.action for o in first] == [TopicAction.CREATED] * 5
    second = create_topics(client, topics)
    assert [o.action for o in second] == [TopicAction.EXISTS] * 5
    ensure_topics(client, topics)  # the plain API agrees

    found = {info.name: info for info in list_topics(client)}
    expected = {
        topics.chunks: (3, "delete"),
        topics.audio: (3, "delete"),
        topics.live: (3, "delete"),
        topics.dlq: (2, "delete"),
        topics.progress: (3, "compact"),
    }
    for name, (partitions, policy) in expected.items():
        assert found[name].partitions == partitions
        assert found[name].config_value("cleanup.policy") == policy
    # lag's time lag reads the chunk topic's timestamps: the broker's clock, not a talker's
    assert found[topics.chunks].config_value("message.timestamp.type") == "LogAppendTime"
    assert found[topics.audio].config_value("message.timestamp.type") == "CreateTime"
    # the live copy is transient: minutes of retention, not the broker's week
    assert found[topics.live].config_value("retention.ms") == "600000"


@pytest.mark.kafka
def test_existing_topics_that_do_not_fit_are_reported_not_changed(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    client = {"bootstrap.servers": kafka_bootstrap}
    topics = fresh_topics(unique_name, partitions=4)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    misfits = [
        NewTopic(topics.chunks, 2, 1),  # too few partitions
        NewTopic(topics.progress, 4, 1, config={"cleanup.policy": "delete"}),  # not compacted
    ]
    for future in admin.create_topics(misfits).values():
        future.result(timeout=30)

    with pytest.raises(TopicMismatchError) as error:
        ensure_topics(client, topics)
    assert error.value.problems == (
        f"topic {topics.chunks} exists with 2 partitions, fewer than the 4 configured "
        "(delete it, or set partitions in --topics-config)",
        f"topic {topics.progress} exists with cleanup.policy=delete, "
        "but codeclog needs cleanup.policy=compact",
    )
    assert {i.name: i.partitions for i in list_topics(client)}[topics.chunks] == 2


@pytest.mark.kafka
def test_cli_topics_create_then_list(
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "topics.json"
    topics = fresh_topics(unique_name, partitions=2)
    names = {"chunks": topics.chunks, "audio": topics.audio, "dlq": topics.dlq}
    config.write_text(json.dumps({**names, "progress": topics.progress, "partitions": 2}))
    cluster = ["--bootstrap", kafka_bootstrap, "--topics-config", str(config)]
    assert main(["topics", "create", *cluster]) == 0
    out = capsys.readouterr().out
    assert "cluster of 1 broker: new topics get replication factor 1, min.insync.replicas 1" in out
    assert (
        f"created  {topics.progress} (2 partitions, cleanup.policy=compact, RF 1, min ISR 1)"
        in (out)
    )
    chunks = f"created  {topics.chunks} (2 partitions, cleanup.policy=delete, "
    assert chunks + "message.timestamp.type=LogAppendTime, RF 1, min ISR 1)" in out
    assert main(["topics", "list", "--bootstrap", kafka_bootstrap]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows[topics.progress][1:3] == ["2", "1"]
    assert "cleanup.policy=compact" in rows[topics.progress][3]


# ----------------------------------------------------------------------------- pure checks


def _spec(partitions: int = 8, policy: CleanupPolicy = CleanupPolicy.DELETE) -> TopicSpec:
    return TopicSpec("t", partitions, policy, "test")


def _info(partitions: int, policy: str | None) -> TopicInfo:
    config = () if policy is None else (("cleanup.policy", policy),)
    return TopicInfo("t", partitions, 1, config)


@pytest.mark.parametrize(
    ("case", "spec", "info", "complaints"),
    [
        ("exact fit", _spec(), _info(8, "delete"), []),
        ("more partitions are fine", _spec(), _info(16, "delete"), []),
        ("fewer partitions", _spec(), _info(4, "delete"), ["4 partitions, fewer than the 8"]),
        ("not compacted", _spec(policy=CleanupPolicy.COMPACT), _info(8, "delete"), ["compact"]),
        (
            "compact,delete is not compact",
            _spec(8, CleanupPolicy.COMPACT),
            _info(8, "compact,delete"),
            ["compact,delete"],
        ),
        ("unknown policy is not judged", _spec(), _info(8, None), []),
        ("both wrong", _spec(), _info(1, "compact"), ["1 partitions", "cleanup.policy=compact"]),
    ],
)
def test_check_topic(case: str, spec: TopicSpec, info: TopicInfo, complaints: list[str]) -> None:
    problems = check_topic(spec, info)
    assert len(problems) == len(complaints)
    for problem, complaint in zip(problems, complaints, strict=True):
        assert complaint in problem


def test_only_the_chunk_topic_gets_log_append_time() -> None:
    specs = topic_specs(TopicsConfig())
    assert [dict(s.settings).get("message.timestamp.type") for s in specs] == [
        "LogAppendTime",
        None,
        None,
        None,
        None,
    ]


@pytest.mark.parametrize(
    ("found", "notes"),
    [("LogAppendTime", 0), ("CreateTime", 1), (None, 0)],
    ids=["log_append_time", "create_time", "not_described"],
)
def test_an_existing_chunk_topic_that_keeps_create_time_is_noted_not_refused(
    found: str | None, notes: int
) -> None:
    spec = topic_specs(TopicsConfig())[0]
    config = (("cleanup.policy", "delete"),)
    if found is not None:
        config += (("message.timestamp.type", found),)
    info = TopicInfo(spec.name, 8, 1, config)
    assert check_topic(spec, info) == []
    got = setting_notes(spec, info)
    assert len(got) == notes
    if notes:
        assert "keeps message.timestamp.type=CreateTime (new topics get LogAppendTime)" in got[0]


def test_topic_specs_follow_the_config() -> None:
    specs = topic_specs(TopicsConfig(chunks="c", progress="p", partitions=3, dlq_partitions=2))
    assert [(s.name, s.partitions, s.cleanup_policy.value) for s in specs] == [
        ("c", 3, "delete"),
        ("codec.audio", 3, "delete"),
        ("codec.audio.live", 3, "delete"),
        ("codec.dlq", 2, "delete"),
        ("p", 3, "compact"),
    ]


# ----------------------------------------------------------------------------- TopicsConfig


@pytest.mark.parametrize(
    ("case", "raw", "message"),
    [
        ("unknown key", {"partitons": 4}, "unknown topic config keys: partitons"),
        ("two unknown keys", {"b": 1, "a": 1}, "unknown topic config keys: a, b"),
        ("partitions as text", {"partitions": "8"}, "'partitions' must be int"),
        ("partitions as bool", {"dlq_partitions": True}, "'dlq_partitions' must be int"),
        ("zero partitions", {"partitions": 0}, "must be >= 1, got 0"),
        ("name as number", {"chunks": 5}, "'chunks' must be str"),
        ("empty name", {"audio": ""}, "'audio' must not be empty"),
        ("duplicate names", {"audio": "codec.chunks"}, "topic names must be distinct"),
        ("live as the audio", {"live": "codec.audio"}, "topic names must be distinct"),
        ("empty live name", {"live": ""}, "'live' must not be empty"),
    ],
)
def test_topics_config_refuses(case: str, raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TopicsConfig.from_dict(raw)


def test_topics_config_accepts_known_keys() -> None:
    config = TopicsConfig.from_dict({"chunks": "a.b", "partitions": 16})
    assert (config.chunks, config.partitions, config.audio) == ("a.b", 16, "codec.audio")
    assert config.live == "codec.audio.live"  # beside the audio topic unless named
    assert TopicsConfig.from_dict({"audio": "x"}).live == "x.live"
    assert TopicsConfig.from_dict({"live": "y"}).live == "y"


@pytest.mark.parametrize(
    ("case", "content", "message"),
    [
        ("not json", "{", "not JSON"),
        ("a list", "[1]", "expected a JSON object"),
        ("unknown key", '{"x": 1}', "unknown topic config keys: x"),
    ],
)
def test_topics_config_load_refuses(tmp_path: Path, case: str, content: str, message: str) -> None:
    path = tmp_path / "topics.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        TopicsConfig.load(path)


def test_topics_config_load_defaults_and_missing_file(tmp_path: Path) -> None:
    assert TopicsConfig.load(None) == TopicsConfig()
    with pytest.raises(UserFileError, match=r"cannot read --topics-config .*: no such file"):
        TopicsConfig.load(tmp_path / "absent.json")


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize(
    ("case", "content", "expected"),
    [
        ("empty", "", {}),
        ("comments and blanks", "# c\n\n  # indented\n", {}),
        ("spaces around =", " security.protocol = SASL_SSL \n", {"security.protocol": "SASL_SSL"}),
        ("= inside the value", "sasl.jaas=a=b;c=d\n", {"sasl.jaas": "a=b;c=d"}),
        ("empty value", "ssl.key.password=\n", {"ssl.key.password": ""}),
        ("last wins", "a=1\na=2\n", {"a": "2"}),
    ],
)
def test_read_properties(tmp_path: Path, case: str, content: str, expected: dict[str, str]) -> None:
    path = tmp_path / "client.properties"
    path.write_text(content)
    assert read_properties(path) == expected


@pytest.mark.parametrize(
    ("case", "content", "message"),
    [
        ("no =", "a=1\njust-a-key\n", r":2: expected key=value"),
        ("empty key", "=value\n", r":1: expected key=value"),
    ],
)
def test_read_properties_refuses(tmp_path: Path, case: str, content: str, message: str) -> None:
    path = tmp_path / "client.properties"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        read_properties(path)


def test_read_properties_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserFileError, match=r"cannot read --kafka-config .*: no such file"):
        read_properties(tmp_path / "absent.properties")


_KEYS = st.from_regex(r"[a-z][a-z0-9.]{0,20}", fullmatch=True)
_VALUES = st.from_regex(r"[A-Za-z0-9_=;:/.-]{0,20}", fullmatch=True)


@given(st.dictionaries(_KEYS, _VALUES, max_size=8))
def test_read_properties_round_trips(
    tmp_path_factory: pytest.TempPathFactory, props: dict[str, str]
) -> None:
    path = tmp_path_factory.mktemp("props") / "client.properties"
    path.write_text("# generated\n" + "".join(f"{k}={v}\n" for k, v in props.items()))
    assert read_properties(path) == props


@pytest.mark.parametrize(
    ("brokers", "expected"), [(0, (1, 1)), (1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (5, (3, 2))]
)
def test_replication_follows_the_cluster_size(brokers: int, expected: tuple[int, int]) -> None:
    assert replication_for(brokers) == expected
