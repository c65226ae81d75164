"""A secured three-node cluster (`codeclog broker start --nodes 3 --security scram`): every node
serves SASL_SSL only, from one CA, one broker key and one set of SCRAM users, and the role files
name every node. Through the CLI, each role under its own file: the admin creates the topics
(RF 3, min ISR 2) and the ACLs, the talker speaks, a node is SIGKILLed, the vocoder decodes
while it is down, the node restarts, the replay role verifies exactly-once audio and the
monitor measures lag; a role outside its grant is refused in one line with exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from codeclog.cli.config import read_properties
from codeclog.devtools.broker import BrokerSettings
from codeclog.devtools.cluster import LocalCluster
from codeclog.devtools.jars import JarFetcher

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.vocoder]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def secured_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    settings = BrokerSettings(
        heap_min_mb=128,
        heap_max_mb=512,
        start_timeout_s=240,  # three cold JVMs with TLS on two shared cores
        security="scram",
        die_with_parent=True,
        extra_jvm_args=("-XX:TieredStopAtLevel=1",),
        fetcher=JarFetcher(timeout_s=240.0),
    )
    cluster = LocalCluster(tmp_path_factory.mktemp("secured-cluster"), 3, settings)
    try:
        cluster.start()
    except Exception as exc:
        pytest.fail(f"the secured cluster did not start: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


def _runner(
    cluster: LocalCluster, topics_file: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(role: str, *args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
        config = ["--kafka-config", str(cluster.role_configs()[role])]
        command = [sys.executable, "-m", "codeclog.cli", *args, *config]
        command += ["--topics-config", str(topics_file)]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)

    return run


@pytest.mark.long  # 110 s of CI; test_security_units checks the secured node properties, the
# single secured broker (tests/security, in CI) the same roles, ACLs and refusals
def test_every_role_does_its_job_on_a_secured_cluster_through_a_node_kill(
    secured_cluster: LocalCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    cluster = secured_cluster
    roles = cluster.role_configs()
    assert set(roles) == {"admin", "talker", "vocoder", "monitor", "replay"}
    every_node = cluster.bootstrap
    for path in roles.values():
        props = read_properties(path)
        assert props["bootstrap.servers"] == every_node
        assert props["security.protocol"] == "SASL_SSL"
    for node_id in (1, 2, 3):  # no node has a plaintext listener
        text = cluster.node(node_id).properties_path.read_text()
        assert "PLAINTEXT://" not in text and "SASL_SSL://" in text, text
    names = {k: unique_name(k) for k in ("chunks", "audio", "dlq", "progress")}
    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps({**names, "partitions": 2}))
    run = _runner(cluster, topics_file)
    group = unique_name("group")

    created = run("admin", "topics", "create", "--acls", "--group", group)
    assert created.returncode == 0, created.stderr
    assert "replication factor 3" in created.stdout + created.stderr, created.stderr
    talked = run("talker", "talk", "--sessions", "3", "--seconds", "4", "--seed", "3")
    assert talked.returncode == 0, talked.stderr

    cluster.kill(2)  # a node down: leaders move, min ISR 2 of 3 still holds
    vocoded = run(
        "vocoder", "vocode", "--vocoder", "tiny", "--group", group, "--exit-when-idle", "4"
    )
    assert vocoded.returncode == 0, vocoded.stderr
    cluster.restart(2)

    verified = run("replay", "verify", "--vocoder", "tiny", "--group", group)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "OK: exactly once, byte-identical" in verified.stdout
    lag = run("monitor", "lag", "--group", group)
    assert lag.returncode == 0, lag.stdout + lag.stderr

    # outside its grant: the talker may not read the chunks it wrote back
    refused = run("talker", "verify", "--vocoder", "tiny", "--group", group, timeout_s=120)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "User:talker is not authorised to" in lines[0], refused.stderr
