"""`codeclog topics create|list`: the codeclog topics on any Kafka cluster."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from codeclog.cli.commands.acls import add_acl_args, apply_from_args
from codeclog.cli.config import add_kafka_args, kafka_client_config, topics_config
from codeclog.cli.parsing import Subparsers, add_command, add_flag
from codeclog.kafka.topics import (
    TopicAction,
    TopicMismatchError,
    create_topics,
    format_config,
    list_topics,
    replication_for,
)

DESCRIPTION = """\
Create and inspect the topics codeclog uses:
  codec.chunks    codec chunks and control events, keyed by request id (8 partitions;
                  message.timestamp.type=LogAppendTime: lag's time lag on the broker's clock)
  codec.audio     decoded audio chunks, keyed by request id (8 partitions)
  codec.audio.live  the live copy of each window, written before its transaction (8
                  partitions; retention.ms 10 minutes: docs/listening.md)
  codec.dlq       dead letters: refused records, whole (1 partition)
  codec.progress  compacted (cleanup.policy=compact): per-request checkpoints (8 partitions)

Names and partition counts come from --topics-config (a JSON object; unknown keys are refused).
New topics get replication factor 3 and min.insync.replicas 2 on a cluster of three brokers or
more (`codeclog broker start --nodes 3`), 1 and 1 on one broker; `create` says what it chose.
`create` is idempotent: topics that exist are kept. A topic that exists with fewer partitions
than configured or with another cleanup.policy is reported and the command fails, since
changing it would move keys between partitions. A chunk topic that keeps CreateTime is
reported (one line on stderr) and kept.
"""

EPILOG = """\
examples:
  codeclog topics create                          # on the local broker (codeclog broker start)
  codeclog topics create --bootstrap kafka:9092 --kafka-config client.properties
  echo '{"partitions": 16}' > topics.json && codeclog topics create --topics-config topics.json
  codeclog topics list --all                      # include __consumer_offsets and friends
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers, "topics", "create or list the codeclog topics", DESCRIPTION, EPILOG
    )
    actions = parser.add_subparsers(dest="topics_action", metavar="ACTION", required=True)
    create = add_command(
        actions, "create", "create missing topics, check existing ones", DESCRIPTION, EPILOG
    )
    _add_common(create)
    add_flag(
        create,
        "--acls",
        help="also apply the role ACLs (`codeclog acls apply`; needs a principal allowed to)",
    )
    add_acl_args(create)
    create.set_defaults(func=_guarded(_create))
    listing = add_command(
        actions, "list", "list topics: partitions, replication, config", DESCRIPTION, EPILOG
    )
    _add_common(listing)
    add_flag(listing, "--all", help="include internal (__*) topics")
    listing.set_defaults(func=_list)


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_kafka_args(parser)
    parser.add_argument(
        "--timeout-s", type=float, default=30.0, help="admin request timeout (default 30)"
    )


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Topics that exist in a shape codeclog cannot use: one line each, exit 1 (other errors
    are the command line's, codeclog.cli.main)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except TopicMismatchError as exc:
            for problem in exc.problems:
                print(f"codeclog topics {args.topics_action}: {problem}", file=sys.stderr)
            return 1

    return run


def _create(args: argparse.Namespace) -> int:
    outcomes = create_topics(kafka_client_config(args), topics_config(args), args.timeout_s)
    if outcomes:
        brokers = outcomes[0].brokers
        replication, min_isr = replication_for(brokers)
        print(
            f"cluster of {brokers} broker{'' if brokers == 1 else 's'}: new topics get "
            f"replication factor {replication}, min.insync.replicas {min_isr}"
        )
    for outcome in outcomes:
        spec = outcome.spec
        settings = spec.settings if outcome.action is TopicAction.CREATED else ()
        print(
            f"{outcome.action.value:<8} {spec.name} ({_partitions(spec.partitions)}, "
            f"cleanup.policy={spec.cleanup_policy.value}, "
            + "".join(f"{key}={value}, " for key, value in settings)
            + f"RF {outcome.replication_factor or '?'}, "
            f"min ISR {outcome.min_insync_replicas or '?'}): {spec.role}"
        )
        for note in outcome.notes:
            print(f"codeclog topics create: {note}", file=sys.stderr)
    if args.acls:
        return apply_from_args(args)
    return 0


def _partitions(count: int) -> str:
    return f"{count} partition" + ("" if count == 1 else "s")


def _list(args: argparse.Namespace) -> int:
    infos = list_topics(kafka_client_config(args), args.timeout_s, include_internal=args.all)
    rows = [("TOPIC", "PARTITIONS", "RF", "CONFIG")]
    rows += [
        (i.name, str(i.partitions), str(i.replication_factor), format_config(i)) for i in infos
    ]
    width = max(len(row[0]) for row in rows)
    for name, partitions, replication, config in rows:
        print(f"{name:<{width}}  {partitions:>10}  {replication:>2}  {config}")
    if not infos:
        print("(no topics; run `codeclog topics create`)", file=sys.stderr)
    return 0
