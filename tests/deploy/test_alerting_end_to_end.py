"""A stopped vocoder pages the on-call receiver: the shipped alerting chain, run for real.

A real broker (kafka_bootstrap), `codeclog lag-exporter` sampling every 5 s as in
docker-compose.yml, Debian's Prometheus and Alertmanager with the SHIPPED configs (host names
mapped to 127.0.0.1 ports, nothing else: tests/deploy/monitoring.py checks the rewrite), the
shipped on-call receiver (deploy/alertmanager/oncall_webhook.py), and a talker publishing with no
vocoder. Issue 41 found the page never left Prometheus (its `alerting:` block was commented
out): Alertmanager held 0 alerts while three page alerts fired.

The bound is the one deploy/prometheus/alerts.yml documents for the listener alerts, read from
the shipped files: the exporter's sampling interval + the scrape interval + the rule group's
evaluation interval + the rule's `for:` (the page leaves Prometheus), + Alertmanager's
group_wait (the page leaves Alertmanager): 5 + 5 + 5 + 15 + 10 = 40 s as shipped, counted from
the talker's first chunk (its record timestamp) to the receiver's clock. On top, PROCESSING_S
for what those intervals do not count: one measurement (the exporter's head read alone may take
--read-timeout, 3 s), Prometheus' and Alertmanager's dispatch and three HTTP hops. Issue 41
measured 33.7 s from the first chunk to the page. Takes about 45 s.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.deploy.monitoring import (
    DEPLOY,
    ROOT,
    first_record_ms,
    http_json,
    local,
    needs_alertmanager,
    needs_prometheus,
    pages,
    processes,
    shipped_prometheus,
    start_alertmanager,
    start_exporter,
    start_oncall,
    start_prometheus,
    start_talker,
    target_health,
    wait_for,
)

pytestmark = [needs_prometheus, needs_alertmanager, pytest.mark.kafka, pytest.mark.slow]

PROCESSING_S = 10.0
PARTITIONS = 4
LISTENER_PAGES = {"CodeclogConsumerGroupEmpty", "CodeclogAudioLagHigh"}


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)", str(duration))
    assert match, duration
    return int(match[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match[2]]


def sampling_s() -> float:
    """The exporter's --interval in docker-compose.yml."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["lag-exporter"]["command"]
    return float(command[command.index("--interval") + 1])


def documented_bound_s() -> float:
    """Sampling + scrape + evaluation + the slowest listener page's `for:` + group_wait."""
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "codeclog-lag")
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    listener = next(g for g in rules["groups"] if g["name"] == "codeclog-listener")
    pending = max(seconds(r["for"]) for r in listener["rules"] if r["alert"] in LISTENER_PAGES)
    route = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())["route"]
    return (
        sampling_s()
        + seconds(job["scrape_interval"])
        + seconds(listener["interval"])
        + pending
        + seconds(route["group_wait"])
    )


def test_a_stopped_vocoder_pages_the_oncall_receiver_within_the_documented_time(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = new_topic("alerting", PARTITIONS)
    group = unique_name("vocoder")  # never started: the vocoder is down
    bound = documented_bound_s()
    with processes(tmp_path) as running:
        exporter = start_exporter(running, kafka_bootstrap, topic, group, sampling_s())
        oncall = start_oncall(running)
        alertmanager = start_alertmanager(running, tmp_path, {"oncall:5001": local(oncall)})
        hosts = {
            "lag-exporter:9310": local(exporter),
            "alertmanager:9093": local(alertmanager),
            "vocoder:9311": "127.0.0.1:9",  # no vocoder: that target is down, as it would be
        }
        prometheus = start_prometheus(running, tmp_path, shipped_prometheus(hosts))
        wait_for(
            "Prometheus sends to the Alertmanager of its alerting: block",
            lambda: _alertmanagers(prometheus),
            30,
            running.tails,
        )
        wait_for(
            "Prometheus scraped the exporter",
            lambda: target_health(prometheus, "codeclog-lag") == "up",
            30,
            running.tails,
        )
        assert pages(running) == []  # nothing waits yet: no page

        start_talker(running, kafka_bootstrap, topic, seconds=bound + 60)

        def paged() -> dict | None:
            for page in pages(running):
                ours = [a for a in page["alerts"] if a["group"] == group]
                names = {a["alertname"] for a in ours if a["status"] == "firing"}
                if page["path"] == "/page" and names & LISTENER_PAGES:
                    return page
            return None

        def diagnostics() -> str:
            alerts = http_json(prometheus, "/api/v1/alerts")
            held = http_json(alertmanager, "/api/v2/alerts")
            return f"Prometheus alerts: {alerts}\nAlertmanager alerts: {held}\n{running.tails()}"

        page = wait_for("the on-call receiver is paged", paged, bound + 60, diagnostics)
        first_chunk_ms = first_record_ms(kafka_bootstrap, topic, PARTITIONS)
        elapsed = (page["received_at_ms"] - first_chunk_ms) / 1000
        pending = _pending_since(prometheus, group)
        print(
            f"first chunk -> pending in Prometheus {pending - first_chunk_ms / 1000:.1f} s -> "
            f"paged {elapsed:.1f} s (documented {bound:g} s + {PROCESSING_S:g} s)"
        )
        assert page["receiver"] == "oncall"
        assert elapsed <= bound + PROCESSING_S, (
            f"paged {elapsed:.1f} s after the first chunk; alerts.yml documents {bound:g} s "
            f"(+ {PROCESSING_S:g} s)\n{diagnostics()}"
        )


def _alertmanagers(prometheus_port: int) -> bool:
    answer = http_json(prometheus_port, "/api/v1/alertmanagers")
    return bool(answer and answer["data"]["activeAlertmanagers"])


def _pending_since(prometheus_port: int, group: str) -> float:
    """When Prometheus first saw a listener page's expression true (epoch seconds)."""
    alerts = http_json(prometheus_port, "/api/v1/alerts")["data"]["alerts"]
    since = [
        datetime.datetime.fromisoformat(a["activeAt"]).timestamp()
        for a in alerts
        if a["labels"].get("alertname") in LISTENER_PAGES and a["labels"].get("group") == group
    ]
    return min(since)
