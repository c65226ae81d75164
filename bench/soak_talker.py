"""The soak's talker process (`python -m bench.soak` starts it): the synthetic duplex talker of
the fault matrix (codeclog.devtools.talker.LiveTalker) speaking round after round in real time,
`--sessions` sessions of `--round-s` seconds each round (new request ids every round), through
one ChunkPublisher for the whole run, until SIGTERM or SIGINT. A process of its own, so the
soak can watch its memory, fds and threads like any other.

With `--clock-file FILE` the talker's clock (produced_at) runs ahead or behind by the seconds
FILE holds ("+600", "-600", "+0"; read at most every half second): the clock-skew fault writes
it (bench.soak's FaketimeClock).

It prints one JSON line per round to stdout ({"rounds", "records", "failed"}) and, once stopped
and closed, a last one with "closed": true; exit 0 when every record was delivered, 1 when not.

    python -m bench.soak_talker --bootstrap HOST:PORT --topic CHUNKS --sessions 4 --round-s 10
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from codeclog.devtools.talker import LiveTalker, Speech, Voice
from codeclog.producers.publisher import PublisherConfig
from codeclog.producers.talker import wall_clock_ms

PRODUCER_ID = "soak-talker"
CLOCK_READ_S = 0.5


class FileClock:
    """Wall-clock ms plus the offset in seconds a file holds, read at most every CLOCK_READ_S
    (a file that is missing or unreadable: no offset)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset_ms = 0
        self.read_at = -CLOCK_READ_S

    def __call__(self) -> int:
        now = time.monotonic()
        if now - self.read_at >= CLOCK_READ_S:
            self.read_at = now
            try:
                self.offset_ms = int(self.path.read_text().strip() or 0) * 1000
            except (OSError, ValueError):
                self.offset_ms = 0
        return int(time.time() * 1000) + self.offset_ms


def _say(**figures: object) -> None:
    print(json.dumps(figures), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--sessions", type=int, required=True, help="sessions per round")
    parser.add_argument("--round-s", type=float, default=10.0, help="length of a round")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--close-s", type=float, default=240.0, help="delivery timeout too")
    parser.add_argument("--clock-file", type=Path, help="the clock's offset in seconds")
    args = parser.parse_args()

    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    config = PublisherConfig(
        topic=args.topic,
        producer_id=PRODUCER_ID,
        delivery_timeout_ms=int(args.close_s * 1000),
    )
    clock = FileClock(args.clock_file) if args.clock_file else wall_clock_ms
    voice = Voice({"bootstrap.servers": args.bootstrap}, config, now_ms=clock)
    talker = LiveTalker(voice, Speech(args.sessions, args.round_s, args.seed), repeat=True)
    talker.start()
    rounds = 0
    while not stop.wait(args.round_s) and talker.is_alive():
        rounds += 1
        _say(rounds=rounds, records=voice.records, failed=voice.failed)
    talker.stop(args.round_s * 3)
    started = time.monotonic()
    report = voice.close(args.close_s)
    error = "" if talker.error is None else f"{type(talker.error).__name__}: {talker.error}"
    _say(
        closed=True,
        records=voice.records,
        failed=voice.failed,
        undelivered=report.undelivered,
        close_s=round(time.monotonic() - started, 1),
        error=error,
    )
    return 0 if voice.failed == 0 and not error else 1


if __name__ == "__main__":
    sys.exit(main())
