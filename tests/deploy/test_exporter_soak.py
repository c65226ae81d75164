"""`codeclog lag-exporter` under a real Prometheus for SOAK_S seconds: it stays alive, every
scrape succeeds, every measurement succeeds, and the series the alerts use are there.

Issue 41 saw the exporter die with SIGSEGV under Prometheus (2 runs of 4, nothing in its log).
The cause was a broker answer, not the scrapes: AdminClient.list_consumer_group_offsets and a
coordinator that moves (docs/lag.md, "The exporter's SIGSEGV"; the deterministic test of that
is tests/lag/test_lag_coordinator.py). This keeps the rest honest: the shipped prometheus.yml,
host names mapped, with the exporter's job scraped every 0.5 s (shipped: 5 s) while the exporter
measures every second and a talker publishes with no vocoder, so scrapes (prometheus_client's
server threads) overlap measurements (librdkafka calls) all the time. About a minute.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from codeclog.devtools.host import pick_free_port
from tests.deploy.monitoring import (
    local,
    needs_prometheus,
    processes,
    query,
    shipped_prometheus,
    start_exporter,
    start_prometheus,
    start_talker,
    stays_alive,
    target_health,
    wait_for,
)

pytestmark = [needs_prometheus, pytest.mark.kafka, pytest.mark.slow]

SOAK_S = 45
SCRAPE = "500ms"
JOB = "codeclog-lag"


def fast_scrapes(config_text: str) -> str:
    """The exporter's job scraped every SCRAPE (its timeout too: Prometheus wants it <=)."""
    config = yaml.safe_load(config_text)
    job = next(j for j in config["scrape_configs"] if j["job_name"] == JOB)
    job["scrape_interval"] = job["scrape_timeout"] = SCRAPE
    return yaml.safe_dump(config, sort_keys=False)


def test_exporter_survives_a_real_prometheus_scraping_it_while_a_talker_publishes(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = new_topic("soak", 4)
    group = unique_name("vocoder")
    with processes(tmp_path) as running:
        start_talker(running, kafka_bootstrap, topic, seconds=SOAK_S + 60)
        exporter_port = start_exporter(running, kafka_bootstrap, topic, group, 1.0)
        hosts = {
            "lag-exporter:9310": local(exporter_port),
            "alertmanager:9093": local(pick_free_port()),  # no Alertmanager here
            "vocoder:9311": "127.0.0.1:9",
        }
        prometheus = start_prometheus(running, tmp_path, fast_scrapes(shipped_prometheus(hosts)))
        wait_for(
            "Prometheus scraped the exporter",
            lambda: target_health(prometheus, JOB) == "up",
            30,
            running.tails,
        )
        exporter = running.process("exporter")
        assert stays_alive(exporter, SOAK_S), f"exit {exporter.returncode}\n{running.tails()}"
        window = f"[{SOAK_S}s]"
        scrapes = query(prometheus, f'count_over_time(up{{job="{JOB}"}}{window})')
        worst = query(prometheus, f'min_over_time(up{{job="{JOB}"}}{window})')
        # about SOAK_S / 0.5 scrapes; at least half of them, or the soak did not soak
        assert scrapes and float(scrapes[0]["value"][1]) >= SOAK_S, running.tails()
        assert float(worst[0]["value"][1]) == 1.0, f"a scrape failed\n{running.tails()}"
        on_group = f'{{group="{group}"}}'
        for series, expected in (
            (f"codeclog_group_members{on_group}", 0.0),  # no vocoder
            (f"codeclog_lag_measure_failures_total{on_group}", 0.0),  # every measurement
        ):
            found = query(prometheus, series)
            assert [float(s["value"][1]) for s in found] == [expected], (series, found)
        for series in ("kafka_consumergroup_group_sum_lag", "codeclog_audio_lag_seconds"):
            found = query(prometheus, f"{series}{on_group} > 0")
            assert found, f"{series} is not exported, or 0 with records waiting"
    assert "Fatal Python error" not in running.output("exporter")
