"""The Prometheus rules and config in deploy/prometheus: promtool checks and unit tests."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lag.exporter import HELP

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
    ):
        assert required in alerts


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
