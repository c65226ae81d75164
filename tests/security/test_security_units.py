"""The pure parts of the secured broker: listener properties, SCRAM format arguments, the ACL
table, and how refusals are worded (no broker here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codeclog.devtools.broker_config import (
    BrokerPorts,
    parse_listener_ports,
    render_server_properties,
)
from codeclog.devtools.security import (
    Credentials,
    UnknownSecurityError,
    check_mode,
    scram_format_args,
    security_files,
    server_security_properties,
)
from codeclog.errors import exit_code
from codeclog.kafka.access import _refusal, principal_of, refusal
from codeclog.kafka.acls import Pattern, Resource, role_acls
from codeclog.topics_config import TopicsConfig


class FakeError:
    def __init__(self, name: str, text: str = "") -> None:
        self._name, self._text = name, text

    def name(self) -> str:
        return self._name

    def str(self) -> str:
        return self._text


def _creds() -> Credentials:
    counter = iter(range(100))
    return Credentials.fresh(lambda _n: f"pw{next(counter)}")


def test_the_secured_node_has_no_plaintext_listener_and_denies_without_acls() -> None:
    files = security_files(Path("/d"))
    secured = server_security_properties(9092, 9093, "127.0.0.1", files, _creds())
    text = render_server_properties(BrokerPorts(9092, 9093), Path("/d/kafka"), secured)
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert "PLAINTEXT" not in props["listener.security.protocol.map"]
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert parse_listener_ports(text) == BrokerPorts(9092, 9093)  # restarts reuse the ports


def test_every_user_is_created_at_format_time() -> None:
    args = scram_format_args(_creds())
    users = [a.split("name=")[1].split(",")[0] for a in args if a.startswith("SCRAM")]
    assert users == ["admin", "talker", "vocoder", "monitor", "replay"]
    assert args.count("--add-scram") == 5


def test_an_unknown_mode_is_a_usage_error() -> None:
    with pytest.raises(UnknownSecurityError) as caught:
        check_mode("kerberos")
    assert exit_code(caught.value) == 2


def test_each_role_gets_only_its_grants() -> None:
    topics = TopicsConfig()
    specs = role_acls(topics, group="g")
    by_user: dict[str, set[tuple[str, Resource, str]]] = {}
    for s in specs:
        by_user.setdefault(s.user, set()).add((s.operation, s.resource, s.name))
    assert by_user["talker"] == {
        ("WRITE", Resource.TOPIC, topics.chunks),
        ("DESCRIBE", Resource.TOPIC, topics.chunks),
        ("IDEMPOTENT_WRITE", Resource.CLUSTER, "kafka-cluster"),
    }
    assert not any(op == "READ" for op, _, _ in by_user["monitor"])
    assert ("READ", Resource.TOPIC, topics.chunks) in {
        (s.operation, s.resource, s.name) for s in role_acls(topics, monitor_reads=True)
    }
    vocoder_writes = {name for op, res, name in by_user["vocoder"] if op == "WRITE"}
    assert vocoder_writes == {topics.audio, topics.live, topics.dlq, topics.progress, "g-"}
    assert [s.pattern for s in specs if s.resource is Resource.TRANSACTIONAL_ID] == [
        Pattern.PREFIXED,
        Pattern.PREFIXED,
    ]
    replay_writes = {(name, s) for op, s, name in by_user["replay"] if op == "WRITE"}
    assert replay_writes == {("codec.replay.", Resource.TOPIC)}


def test_refused_logins_are_told_apart() -> None:
    config = {"bootstrap.servers": "b:1", "sasl.username": "talker", "sasl.mechanism": "M"}
    auth = FakeError("_AUTHENTICATION", "sasl_ssl://b:1/bootstrap: bad creds (after 3ms in x)")
    assert _refusal(config, [auth], []) == (
        "User:talker could not authenticate to b:1 with M: wrong password or unknown user "
        "(bad creds)"
    )
    tls = _refusal({**config, "ssl.ca.location": "/ca"}, [FakeError("_SSL", "x")], [])
    assert tls is not None and "does not verify against ssl.ca.location=/ca" in tls
    closed = ["b:1/bootstrap: Disconnected (after 1ms in state APIVERSION_QUERY)"]
    plain = _refusal({"bootstrap.servers": "b:1"}, [], closed)
    assert plain is not None and "probably a TLS/SASL listener" in plain
    assert _refusal(config, [FakeError("_ALL_BROKERS_DOWN")], []) is None  # merely down


def test_an_authorisation_refusal_names_principal_operation_and_resource() -> None:
    error = FakeError("GROUP_AUTHORIZATION_FAILED", "Broker: Group authorization failed")
    refused = refusal(error, {"sasl.username": "monitor"}, {"group": "DESCRIBE group g"})
    assert refused is not None and exit_code(refused) == 2
    assert str(refused).startswith(
        "User:monitor is not authorised to DESCRIBE group g (GROUP_AUTHORIZATION_FAILED)"
    )
    assert refusal(FakeError("NOT_LEADER_FOR_PARTITION"), {}, {}) is None
    assert principal_of({}) == "User:ANONYMOUS"


def test_a_secured_cluster_node_keeps_its_quorum_and_shares_one_set_of_material(
    tmp_path: Path,
) -> None:
    from codeclog.devtools.broker import BrokerSettings
    from codeclog.devtools.cluster_layout import ClusterLayout, render_cluster_properties
    from codeclog.devtools.cluster_nodes import ClusterNode

    ports = (BrokerPorts(1001, 2001), BrokerPorts(1002, 2002), BrokerPorts(1003, 2003))
    layout = ClusterLayout("abc", ports)
    node = ClusterNode(tmp_path / "node-2", BrokerSettings(security="scram"), 2, layout)
    assert node.security_files.root == tmp_path / "security"  # the cluster's, not the node's
    secured = server_security_properties(1002, 2002, "127.0.0.1", node.security_files, _creds())
    text = render_cluster_properties(layout, 2, tmp_path / "node-2" / "kafka", secured)
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert props["listeners"] == "SASL_SSL://127.0.0.1:1002,CONTROLLER://127.0.0.1:2002"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:1002"
    assert "PLAINTEXT" not in props["listener.security.protocol.map"]
    assert props["controller.quorum.voters"] == layout.voters
    assert props["min.insync.replicas"] == "2"
    # whichever node starts last, every role file names every node
    node.security_files.root.mkdir()
    node._credentials = _creds()
    state = node._security_state("127.0.0.1:1002")
    talker = Path(state["role_configs"]["talker"]).read_text()
    assert "bootstrap.servers=127.0.0.1:1001,127.0.0.1:1002,127.0.0.1:1003" in talker


def test_a_refusal_of_a_resource_the_reader_does_not_use_is_told_apart() -> None:
    from codeclog.kafka.access import refusal_of_unused

    group = FakeError("GROUP_AUTHORIZATION_FAILED")
    topic = FakeError("TOPIC_AUTHORIZATION_FAILED")
    assert refusal_of_unused(group, ("topic",))  # an assign()-only reader's group id
    assert not refusal_of_unused(topic, ("topic",))
    assert not refusal_of_unused(group, ("topic", "group"))
    assert not refusal_of_unused(FakeError("_TRANSPORT"), ())  # not a refusal at all
