"""Reproduction rate of the lag exporter's SIGSEGV on a real broker, before and after the fix.

    python -m bench.coordinator_race [--rounds N] [--seconds S] [--groups G]

Each round starts, for each reader, a FRESH local broker (no __consumer_offsets yet, as when no
vocoder ever ran) and, the moment it serves requests, a child process that asks the committed
offsets of G groups (spread over __consumer_offsets' 50 partitions) again and again for S
seconds, while the group coordinator creates and loads those partitions:

* admin: `AdminClient.list_consumer_group_offsets` (what `codeclog lag-exporter` used): an
  OffsetFetch answered NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE in that window kills the
  process with SIGSEGV inside librdkafka (docs/lag.md, "The exporter's SIGSEGV");
* consumer: `codeclog.lag.readers.CommittedReader` (a consumer carrying the group id).

Prints one markdown row per reader: rounds, rounds whose child died (and how), and the answers
counted. A race: the rate depends on the machine and its load.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from codeclog.lag.readers import CommittedReader, MeasureError

READERS = ("admin", "consumer")
TOPIC = "codec.chunks"  # need not exist: OffsetFetch does not check it


def _ask_admin(admin: AdminClient, group: str) -> str:
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(TOPIC, 0)])
    try:
        admin.list_consumer_group_offsets([request], request_timeout=5)[group].result(10)
    except KafkaException as exc:
        return str(exc.args[0].name()) if exc.args else "KafkaException"
    return "answered"


def _ask_consumer(reader: CommittedReader, group: str) -> str:
    try:
        reader.read(group, TOPIC, [0])
    except MeasureError as exc:
        return f"MeasureError: {str(exc)[:60]}"
    return "answered"


def child(reader_name: str, bootstrap: str, seconds: float, groups: int) -> int:
    config: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, "log_level": 2}
    answers: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + seconds
    admin = AdminClient(config) if reader_name == "admin" else None
    reader = CommittedReader(config, timeout_s=10.0) if reader_name == "consumer" else None
    while time.monotonic() < deadline:
        for i in range(groups):
            group = f"race-{i}"
            if admin is not None:
                answers[_ask_admin(admin, group)] += 1
            elif reader is not None:
                answers[_ask_consumer(reader, group)] += 1
    if reader is not None:
        reader.close()
    print(json.dumps(dict(answers)), flush=True)
    return 0


def _run_child(reader: str, bootstrap: str, args: argparse.Namespace) -> tuple[str, str]:
    argv = [sys.executable, "-m", "bench.coordinator_race", "--child", reader]
    argv += ["--bootstrap", bootstrap, "--seconds", str(args.seconds), "--groups", str(args.groups)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode < 0:
        return f"killed by {signal.Signals(-done.returncode).name}", ""
    lines = done.stdout.strip().splitlines()
    return f"exit {done.returncode}", lines[-1] if lines else ""


def main(args: argparse.Namespace) -> int:
    from codeclog.devtools.broker import BrokerSettings, LocalBroker

    outcomes: dict[str, list[str]] = {r: [] for r in READERS}
    answers: dict[str, collections.Counter[str]] = {r: collections.Counter() for r in READERS}
    for round_no in range(args.rounds):
        for reader in READERS:  # a fresh broker for each: each reader meets a young coordinator
            with tempfile.TemporaryDirectory(prefix="codeclog-race-") as tmp:
                broker = LocalBroker(Path(tmp), BrokerSettings(die_with_parent=True))
                bootstrap = broker.start(lambda message: None).bootstrap
                try:
                    how, counted = _run_child(reader, bootstrap, args)
                finally:
                    broker.stop()
            outcomes[reader].append(how)
            answers[reader].update(json.loads(counted) if counted else {})
            print(f"round {round_no + 1}: {reader}: {how}", file=sys.stderr, flush=True)
    print("| reader | fresh brokers | child died | answers |")
    print("|---|---|---|---|")
    for reader in READERS:
        died = [o for o in outcomes[reader] if o != "exit 0"]
        counts = ", ".join(f"{k} {v}" for k, v in answers[reader].most_common())
        print(f"| {reader} | {args.rounds} | {len(died)} ({', '.join(died) or '-'}) | {counts} |")
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="fresh brokers (default 6)")
    parser.add_argument("--seconds", type=float, default=8.0, help="per reader (default 8)")
    parser.add_argument("--groups", type=int, default=60, help="groups asked (default 60)")
    parser.add_argument("--child", choices=READERS, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    parsed = parse()
    if parsed.child:
        sys.exit(child(parsed.child, parsed.bootstrap, parsed.seconds, parsed.groups))
    sys.exit(main(parsed))
