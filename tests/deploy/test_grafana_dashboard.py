"""The Grafana dashboard in deploy/grafana: every metric it queries is exported, its panels
cover what an operator looks at, and the compose stack provisions it next to Prometheus.

Grafana's dashboard-linter (a Go module) could not be installed here (the Go module proxy
refuses github.com/grafana/dashboard-linter), so the checks below that mirror its rules
(datasource variable, job/instance matchers, $__rate_interval, titles, descriptions, units)
are ours, not the linter's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from codeclog.consumers.member.metrics import VocoderMetrics
from codeclog.lag.exporter import HELP

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "codeclog.json"
PROMETHEUS_OWN = {"up"}  # series Prometheus writes itself for every scrape target
# PromQL words that can precede "(" or "{" and are not metric names
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}


def consumer_series() -> set[str]:
    """Sample names the vocoder's metrics endpoint exposes (prometheus_client conventions)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    metrics = VocoderMetrics.create(None)
    names: set[str] = set()
    for field in dataclasses.fields(metrics):
        for family in getattr(metrics, field.name).describe():
            names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def exported() -> set[str]:
    return set(HELP) | consumer_series()


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expressions() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in panels():
        for target in panel["targets"]:
            yield panel["title"], target["expr"]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            yield f"${variable['name']}", variable["query"]["query"]


def metric_names(expr: str) -> set[str]:
    """Identifiers used as series selectors: followed by `{` or `[`, or a bare name."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_labels = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_grouping = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", without_labels)
    names = set()
    for match in re.finditer(r"(?<![\w$])([a-zA-Z_:][\w:]*)\s*(\(?)", without_grouping):
        name, call = match.groups()
        if call or name in PROMQL_WORDS or name.startswith("__"):
            continue  # a function, a keyword, or $__rate_interval
        if re.fullmatch(r"\d+[smhdwy]", name):
            continue
        names.add(name)
    return names


def test_the_dashboard_is_found_and_has_panels() -> None:
    assert dashboard()["uid"] == "codeclog-lag"
    assert len(panels()) >= 10


def test_metric_name_extraction() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le) (rate(codeclog_vocoder_end_to_end_seconds_bucket"
        '{job=~"$job"}[$__rate_interval]))) and on (group) up == 1'
    )
    assert metric_names(expr) == {"codeclog_vocoder_end_to_end_seconds_bucket", "up"}
    assert metric_names('label_values(codeclog_group_members{job=~"$job"}, group)') == {
        "codeclog_group_members",
        "group",
    }


def test_every_queried_metric_is_exported_by_the_exporter_or_the_consumer() -> None:
    """A renamed metric would leave a panel silently empty."""
    known = exported() | PROMETHEUS_OWN
    used: dict[str, str] = {}
    for where, expr in expressions():
        names = metric_names(expr)
        if expr.startswith("label_values("):
            names -= {expr.rsplit(",", 1)[1].strip(" )")}  # the label, not a metric
        assert names, f"{where}: no metric in {expr!r}"
        used.update({name: where for name in names})
    unknown = {name: where for name, where in used.items() if name not in known}
    assert not unknown, f"metrics queried but exported by nobody: {unknown}"


@pytest.mark.parametrize(
    ("what", "metric"),
    [
        ("lag in records", "kafka_consumergroup_group_lag"),
        ("lag in seconds", "kafka_consumergroup_group_lag_seconds"),
        ("lag in audio seconds", "codeclog_audio_lag_seconds"),
        ("partitions measured from the reset position", "codeclog_partition_lag_from_reset"),
        ("group status", "codeclog_group_status"),
        ("group members", "codeclog_group_members"),
        ("group rules", "codeclog_group_rule"),
        ("windows/s", "codeclog_vocoder_windows_total"),
        ("RTF", "codeclog_vocoder_rtf"),
        ("end-to-end chunk latency", "codeclog_vocoder_end_to_end_seconds_bucket"),
        ("open streams", "codeclog_vocoder_open_streams"),
        ("dead letters", "codeclog_vocoder_rejections_total"),
    ],
)
def test_an_operator_sees(what: str, metric: str) -> None:
    assert any(metric in metric_names(expr) for _, expr in expressions()), what


def test_lag_panels_are_per_partition_and_dead_letters_by_reason() -> None:
    by_title = {p["title"]: p for p in panels()}
    for title in ("Lag (records)", "Time lag (s)", "Audio lag (s)"):
        assert "{{partition}}" in by_title[title]["targets"][0]["legendFormat"]
    assert "by (reason)" in by_title["Dead letters by reason"]["targets"][0]["expr"]


def test_panels_follow_the_linter_rules_we_can_check() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"job", "instance", "group"} <= set(variables)
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        title = panel["title"]
        assert title and panel["description"], title
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        assert panel["targets"], title
        for target in panel["targets"]:
            expr = target["expr"]
            assert target["datasource"]["uid"] == "${datasource}", title
            for selector in re.findall(r"[a-z_:]+\{[^}]*\}", expr):
                assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, expr
            for window in re.findall(r"\[([^\]]+)\]", expr):
                assert window == "$__rate_interval", f"{title}: use $__rate_interval"


def compose_grafana() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return compose["services"]["grafana"]


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """container path -> host path (relative to the repository)."""
    out = {}
    for volume in service["volumes"]:
        host, container = volume.split(":")[:2]
        out[container] = ROOT / host
    return out


def test_compose_provisions_the_dashboard_next_to_prometheus() -> None:
    grafana = compose_grafana()
    mounted = mounts(grafana)
    provisioning = mounted["/etc/grafana/provisioning"]
    assert provisioning == GRAFANA / "provisioning"
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "9090:9090" in compose["services"]["prometheus"]["ports"]
    assert "prometheus" in grafana["depends_on"]
    providers = yaml.safe_load((provisioning / "dashboards" / "codeclog.yml").read_text())
    (provider,) = providers["providers"]
    assert mounted[provider["options"]["path"]] == DASHBOARD.parent
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
