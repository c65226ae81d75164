"""The compose stack is validated here (no Docker engine on CI): config, services, GPU, image."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {
    "kafka",
    "topic-init",
    "talker",
    "vocoder",
    "vocoder-gpu",
    "lag-exporter",
    "prometheus",
    "grafana",
    "alertmanager",
    "oncall",
}


def _config() -> dict:
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose (Debian package) is not installed")
    return _rendered()


@functools.cache
def _rendered() -> dict:
    result = subprocess.run(
        ["docker-compose", "--profile", "gpu", "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "CODECLOG_TOKEN2WAV_DIR": "/ckpt"},
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_file_is_valid_and_has_every_service() -> None:
    config = _config()
    assert set(config["services"]) == SERVICES


def test_gpu_vocoder_reserves_a_gpu_and_mounts_the_checkpoint() -> None:
    service = _config()["services"]["vocoder-gpu"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    mounts = [str(v) for v in service["volumes"]]
    assert any("/ckpt" in m and "/models/token2wav" in m for m in mounts)
    assert "cuda" in service["command"]


def test_kafka_is_kraft_with_single_node_internal_topics() -> None:
    env = _config()["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert str(env[key]) == "1"


def test_prometheus_mounts_the_rules_it_loads() -> None:
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    for rule_file in prometheus.get("rule_files", []):
        assert (ROOT / "deploy/prometheus" / Path(rule_file).name).exists(), rule_file


def test_dockerfile_copies_every_package() -> None:
    """codeclog/ and every folder it links to (codeclog/consumers -> ../consumers, ...)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    linked = [p.name for p in (ROOT / "codeclog").iterdir() if p.is_symlink()]
    assert {"consumers", "producers", "schemas", "vocoder", "replay", "lag", "omni"} <= set(linked)
    for package in ["codeclog", *linked]:
        assert f"COPY {package} ./{package}" in dockerfile
