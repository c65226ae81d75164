"""A stand-in on-call receiver for the compose stack: every Alertmanager webhook notification it
gets is printed to stdout as one JSON line, so `docker compose logs oncall` shows each page.

Replace it with your paging and chat integrations (deploy/README.md): point the webhook URLs in
alertmanager.yml at them and drop the `oncall` service. Standard library only, so it runs in any
Python 3.9+ image (docker-compose.yml runs it in the codeclog image).

    python oncall_webhook.py --port 5001
    # prints {"received_at_ms": ..., "path": "/page", "status": "firing",
    #         "alerts": [{"alertname": ..., "severity": ..., "group": ..., "summary": ...}]}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 1 << 20  # Alertmanager batches alerts; a megabyte is far more than one notification
_PRINTING = threading.Lock()


def summary(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What an on-call engineer reads from one notification (Alertmanager webhook format v4)."""
    alerts = []
    for alert in body.get("alerts", []):
        labels = alert.get("labels", {})
        alerts.append(
            {
                "alertname": labels.get("alertname"),
                "severity": labels.get("severity"),
                "group": labels.get("group"),
                "status": alert.get("status"),
                "summary": alert.get("annotations", {}).get("summary"),
            }
        )
    return {
        "received_at_ms": int(time.time() * 1000),
        "path": path,
        "receiver": body.get("receiver"),
        "status": body.get("status"),
        "alerts": alerts,
    }


def emit(line: str) -> None:
    """`line` on stdout, whole and alone on its line. Each notification is served on a thread
    of its own, and print() writes the text and its newline apart, so two notifications at the
    same moment came out as one line holding both (an end-to-end test's reader saw it)."""
    with _PRINTING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            self.send_error(400, "expected an Alertmanager webhook body")
            return
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError:
            self.send_error(400, "the body is not JSON")
            return
        if not isinstance(body, dict):
            self.send_error(400, "the body is not a JSON object")
            return
        emit(json.dumps(summary(self.path, body), sort_keys=True))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one JSON line per notification is the whole output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=5001, help="port to listen on (default 5001)")
    parser.add_argument("--address", default="0.0.0.0", help="address (default all)")
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.address, args.port), Handler)
    print(
        f"oncall_webhook: listening on {args.address}:{server.server_port}",
        file=sys.stderr,
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop quietly
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
