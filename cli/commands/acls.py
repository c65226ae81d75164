"""`codeclog acls apply|show`: least-privilege ACLs for the talker, vocoder, monitor and replay
roles (docs/security.md, "Roles and ACLs")."""

from __future__ import annotations

import argparse
import sys

from codeclog.cli.config import add_kafka_args, kafka_client_config, topics_config
from codeclog.cli.parsing import Subparsers, add_command, add_flag
from codeclog.kafka.acls import (
    DEFAULT_GROUP,
    DEFAULT_REPLAY_PREFIX,
    acl_table,
    apply_acls,
    role_acls,
)

DESCRIPTION = """\
Grant each codeclog role exactly what its commands need, on a cluster whose authorizer denies
everything else (`codeclog broker start --security scram` starts such a broker, with the SCRAM
users talker, vocoder, monitor and replay and a properties file per role):

  talker   WRITE + DESCRIBE on the chunk topic, IDEMPOTENT_WRITE on the cluster
  vocoder  READ on the chunk topic and its group; WRITE on audio, DLQ and progress; READ on
           progress; WRITE + DESCRIBE on the transactional ids `<group>-*`
  monitor  DESCRIBE on the group and the topics (records lag); READ on the chunk topic only
           with --monitor-reads (time lag and audio lag read the record at the committed offset)
  replay   READ on every codeclog topic and on its own groups (capture, verify, listen,
           replay); WRITE only on topics under --replay-prefix (replay --to-topic)

Run it as a principal allowed to create ACLs: for the local secured broker,
--kafka-config <data-dir>/security/admin.properties. Applying twice changes nothing.
"""

EPILOG = """\
examples:
  codeclog acls show                                   # the table, nothing is sent
  codeclog acls apply --kafka-config ~/.cache/codeclog/broker/security/admin.properties
  codeclog topics create --acls --kafka-config .../security/admin.properties
"""


def register(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers, "acls", "apply least-privilege ACLs for the codeclog roles", DESCRIPTION, EPILOG
    )
    actions = parser.add_subparsers(dest="acls_action", metavar="ACTION", required=True)
    apply = add_command(actions, "apply", "create the ACLs", DESCRIPTION, EPILOG)
    add_kafka_args(apply)
    add_acl_args(apply)
    apply.set_defaults(func=apply_from_args)
    show = add_command(actions, "show", "print the ACL table only", DESCRIPTION, EPILOG)
    show.add_argument("--topics-config", metavar="FILE", help="JSON topic names (see topics)")
    add_acl_args(show)
    show.set_defaults(func=_show)


def add_acl_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("acls")
    group.add_argument(
        "--group", default=DEFAULT_GROUP, help="the vocoder's consumer group (default %(default)s)"
    )
    group.add_argument(
        "--replay-prefix",
        default=DEFAULT_REPLAY_PREFIX,
        help="topics the replay role may write (replay --to-topic); '' for none "
        "(default %(default)s)",
    )
    add_flag(
        group,
        "--monitor-reads",
        help="let the monitor READ the chunk topic, for time lag and audio lag",
    )


def specs_from(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    return role_acls(
        topics_config(args),
        group=args.group,
        replay_prefix=args.replay_prefix,
        monitor_reads=args.monitor_reads,
    )


def apply_from_args(args: argparse.Namespace) -> int:
    specs = specs_from(args)
    count = apply_acls(kafka_client_config(args), specs)
    print(acl_table(specs))
    print(f"{count} ACLs in place", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    print(acl_table(specs_from(args)))
    return 0
