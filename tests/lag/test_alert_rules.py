"""The Prometheus rules and config in deploy/prometheus: promtool checks and unit tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from codeclog.lag.exporter import HELP

PROM_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian: apt-get install prometheus; bootstrap.sh does it)",
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=PROM_DIR, capture_output=True, text=True, timeout=60, check=False
    )


@needs_promtool
@pytest.mark.parametrize(
    "args",
    [
        ("check", "rules", "alerts.yml"),
        ("test", "rules", "alerts_test.yml"),
        ("check", "config", "prometheus.yml"),
    ],
    ids=["check_rules", "test_rules", "check_config"],
)
def test_promtool(args: tuple[str, ...]) -> None:
    result = promtool(*args)
    assert result.returncode == 0, result.stdout + result.stderr


def _alert_names(text: str) -> set[str]:
    return set(re.findall(r"^\s*- alert: (\w+)", text, flags=re.MULTILINE))


def test_every_alert_has_a_unit_test() -> None:
    alerts = _alert_names((PROM_DIR / "alerts.yml").read_text())
    tested = set(re.findall(r"alertname: (\w+)", (PROM_DIR / "alerts_test.yml").read_text()))
    assert alerts, "no alerts found"
    assert alerts <= tested, f"alerts without a unit test: {sorted(alerts - tested)}"


def test_required_alerts_exist() -> None:
    alerts = _alert_names((PROM_DIR / "alerts.yml").read_text())
    for required in (
        "CodeclogTimeLagHigh",
        "CodeclogLagGrowing",
        "CodeclogConsumerStalled",
        "CodeclogConsumerRewound",
        "CodeclogLagMetricsAbsent",
        "CodeclogAudioLagHigh",
        "CodeclogConsumerGroupEmpty",
    ):
        assert required in alerts


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, duration
    return int(match[1]) * (60 if match[2] == "m" else 1)


def test_listener_alerts_page_within_half_a_minute() -> None:
    """Audio lag and an empty group page within the time a listener tolerates: the exporter's
    sampling interval + the scrape interval + the group's evaluation interval + `for:`."""
    rules = yaml.safe_load((PROM_DIR / "alerts.yml").read_text())
    listener = next(g for g in rules["groups"] if g["name"] == "codeclog-listener")
    alerts = {rule["alert"]: rule for rule in listener["rules"]}
    assert {"CodeclogAudioLagHigh", "CodeclogConsumerGroupEmpty"} <= set(alerts)
    assert all(rule["labels"]["severity"] == "page" for rule in alerts.values())
    prometheus = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "codeclog-lag")
    compose = yaml.safe_load((PROM_DIR.parents[1] / "docker-compose.yml").read_text())
    command = compose["services"]["lag-exporter"]["command"]
    sampling = float(command[command.index("--interval") + 1])
    for name, rule in alerts.items():
        delay = (
            sampling
            + _seconds(job["scrape_interval"])
            + _seconds(listener["interval"])
            + _seconds(rule["for"])
        )
        assert delay <= 30, f"{name}: up to {delay:g} s from a stall to the page"


def test_empty_group_alert_counts_lag_measured_from_the_reset_position() -> None:
    """kafka_consumergroup_group_sum_lag includes partitions the group never committed on
    (lag.exporter); a rule on the committed offsets would miss a group that never started."""
    text = (PROM_DIR / "alerts.yml").read_text()
    rules = yaml.safe_load(text)
    empty = next(
        rule
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "CodeclogConsumerGroupEmpty"
    )
    assert "codeclog_group_members" in empty["expr"]
    assert "kafka_consumergroup_group_sum_lag" in empty["expr"]
    assert "group_offset" not in empty["expr"]


def test_rules_use_only_exported_metrics() -> None:
    """A renamed metric would silently turn an alert into a rule that never fires."""
    text = (PROM_DIR / "alerts.yml").read_text()
    expressions = " ".join(re.findall(r"expr: ([^\n]+(?:\n {10}[^\n]+)*)", text))
    used = set(re.findall(r"\b((?:kafka|codeclog)_[a-z_]+)\b", expressions))
    assert used, "no metric names found in the expressions"
    assert used <= set(HELP), f"metrics not exported by lag.exporter: {sorted(used - set(HELP))}"


def test_scrape_targets() -> None:
    text = (PROM_DIR / "prometheus.yml").read_text()
    assert re.search(r"job_name: codeclog-lag\n(?:.*\n)*?.*lag-exporter:9310", text)
    assert re.search(r"job_name: codeclog-vocoder\n(?:.*\n)*?.*vocoder:9311", text)
