"""How a long-running command is asked to stop: SIGTERM (a supervisor: systemd, Kubernetes)
and SIGINT (Ctrl-C) set an event the command's loop reads, so it finishes what it is doing,
closes what it wrote and says what it did."""

from __future__ import annotations

import signal
import threading
from types import FrameType


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop`. Both handlers are installed explicitly: a process
    started in the background by a shell without job control inherits SIGINT ignored, and
    Python then installs no KeyboardInterrupt for it."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
