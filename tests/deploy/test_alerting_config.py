"""The shipped alerting chain is wired: Prometheus sends to the compose stack's Alertmanager,
which mounts its config and whose webhooks reach a service of the stack (issue 41: the
`alerting:` block was commented out and the webhooks pointed at the Alertmanager container's own
127.0.0.1). No Docker engine needed: the files are read as YAML. The chain running for real:
tests/deploy/test_alerting_end_to_end.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy.monitoring import DEPLOY, ROOT, processes, start_oncall

AMTOOL = shutil.which("amtool")
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
ALERTMANAGER_YML = DEPLOY / "alertmanager" / "alertmanager.yml"
ONCALL = DEPLOY / "alertmanager" / "oncall_webhook.py"


def webhook_urls() -> Iterator[urllib.parse.SplitResult]:
    config = yaml.safe_load(ALERTMANAGER_YML.read_text())
    for receiver in config["receivers"]:
        for webhook in receiver.get("webhook_configs", []):
            yield urllib.parse.urlsplit(webhook["url"])


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (Debian prometheus-alertmanager)")
def test_amtool_accepts_the_alertmanager_config() -> None:
    assert AMTOOL is not None
    result = subprocess.run(
        [AMTOOL, "check-config", str(ALERTMANAGER_YML)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_sends_alerts_to_the_compose_alertmanager() -> None:
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    managers = prometheus.get("alerting", {}).get("alertmanagers", [])
    targets = [t for m in managers for c in m["static_configs"] for t in c["targets"]]
    assert targets == ["alertmanager:9093"]
    alertmanager = COMPOSE["services"]["alertmanager"]
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in alertmanager["command"]
    assert "./deploy/alertmanager:/etc/alertmanager:ro" in alertmanager["volumes"]


def test_every_page_routes_to_a_receiver_that_the_compose_stack_runs() -> None:
    urls = list(webhook_urls())
    assert urls, "no webhook receivers"
    for url in urls:
        assert url.hostname in COMPOSE["services"], f"{url.geturl()}: no such compose service"
        service = COMPOSE["services"][url.hostname]
        command = service["command"]
        assert command[command.index("--port") + 1] == str(url.port), url.geturl()
        script = next(v for v in service["volumes"] if "oncall_webhook.py" in v)
        assert (ROOT / script.split(":")[0]).exists(), script
    route = yaml.safe_load(ALERTMANAGER_YML.read_text())["route"]
    pages = next(r for r in route["routes"] if r["matchers"] == ['severity="page"'])
    assert pages["receiver"] == "oncall"


def test_the_oncall_receiver_prints_each_notification_and_refuses_junk(tmp_path: Path) -> None:
    body = {
        "receiver": "oncall",
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "CodeclogConsumerGroupEmpty", "severity": "page"},
                "annotations": {"summary": "nobody consumes"},
            }
        ],
    }
    with processes(tmp_path) as running:
        port = start_oncall(running)
        url = f"http://127.0.0.1:{port}/page"
        assert _post(url, json.dumps(body).encode()) == 200
        assert _post(url, b"not json") == 400
        assert _post(url, b"[1, 2]") == 400
    printed = [json.loads(line) for line in running.output("oncall", "out").splitlines()]
    assert len(printed) == 1
    assert printed[0]["path"] == "/page"
    assert printed[0]["alerts"][0]["alertname"] == "CodeclogConsumerGroupEmpty"
    assert printed[0]["alerts"][0]["summary"] == "nobody consumes"


def _post(url: str, data: bytes) -> int:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


class _SlowOut:
    """A stdout whose every write yields the processor for a moment: what print() writes in two
    parts (the text, then the newline) interleaves with another thread's if nothing stops it."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, part: str) -> int:
        time.sleep(0.01)
        self.text += part
        return len(part)

    def flush(self) -> None:
        pass


def test_notifications_at_the_same_moment_print_one_whole_line_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Alertmanager sends one notification per alert group (alertname, group), so a stopped
    vocoder's two pages (and its warnings) arrive at the same moment, each served on its own
    thread. With print(), two came out on one line (the end-to-end alerting test read
    `{...}{...}` and failed, twice in four full runs)."""
    spec = importlib.util.spec_from_file_location("oncall_webhook", ONCALL)
    assert spec is not None and spec.loader is not None
    webhook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(webhook)
    out = _SlowOut()
    monkeypatch.setattr(webhook.sys, "stdout", out)
    server = webhook.ThreadingHTTPServer(("127.0.0.1", 0), webhook.Handler)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        body = json.dumps({"receiver": "oncall", "status": "firing", "alerts": []}).encode()
        posts = [threading.Thread(target=_post, args=(f"{url}/route-{n}", body)) for n in range(8)]
        for post in posts:
            post.start()
        for post in posts:
            post.join(30)
    finally:
        server.shutdown()
        server.server_close()
    lines = out.text.split("\n")
    assert lines[-1] == ""  # every line ends
    paths = sorted(json.loads(line)["path"] for line in lines[:-1])
    assert paths == sorted(f"/route-{n}" for n in range(8))
