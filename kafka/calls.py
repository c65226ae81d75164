"""Bounded librdkafka calls and the failures the consumer tells apart.
Reasons: docs/operating.md, "Liveness bounds"."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from codeclog.errors import CodeclogError
from codeclog.kafka.access import KafkaAccessError
from codeclog.kafka.log import KAFKA_LOG  # `codeclog vocode -v` shows librdkafka's lines

__all__ = ["KAFKA_LOG"]  # re-exported: the service and its tests import it from here

CALL_GRACE_S = 5.0
_FENCED_NAMES = ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
FENCED_CODES = frozenset(
    code for name in _FENCED_NAMES if (code := getattr(KafkaError, name, None)) is not None
)

# Errors no retry repairs: the member ends with one line and exit 1 (retriable ones never end
# it; they count towards outage_timeout_s only while nothing commits).
_DENIED_NAMES = (
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "SASL_AUTHENTICATION_FAILED",
    "_AUTHENTICATION",
)
DENIED_CODES = frozenset(
    code for name in _DENIED_NAMES if (code := getattr(KafkaError, name, None)) is not None
)
# init_transactions answers worth retrying even when librdkafka does not flag them retriable
RETRY_INIT_CODES = frozenset(
    code
    for name in ("CONCURRENT_TRANSACTIONS", "COORDINATOR_LOAD_IN_PROGRESS", "_TIMED_OUT")
    if (code := getattr(KafkaError, name, None)) is not None
)

# Indefinite outcomes: the request timed out on the client, so it may still land on the broker
# later (a produce, an EndTxn, a TxnOffsetCommit held in the network). docs/operating.md, "The
# defence against late requests": the member re-initialises its producer after one (an epoch
# bump fences it).
INDEFINITE_CODES = frozenset(
    code
    for name in ("_TIMED_OUT", "_MSG_TIMED_OUT", "REQUEST_TIMED_OUT", "_TIMED_OUT_QUEUE")
    if (code := getattr(KafkaError, name, None)) is not None
)

T = TypeVar("T")


class InfrastructureError(CodeclogError):
    """Kafka (or the machine) failed in a way the consumer cannot repair: the process ends."""


class ClusterUnavailableError(InfrastructureError):
    """A read the recovery needs timed out: retried until the outage limit, then the end."""


class OpenTransactionError(ClusterUnavailableError):
    """A read that must see every earlier transaction decided timed out with one still open
    (a member killed mid-transaction): the coordinator aborts it within the transaction
    timeout, so the wait is bounded by that, not only by the outage limit."""


class StuckCallError(CodeclogError):
    """A librdkafka call did not return within its timeout plus CALL_GRACE_S; `worker` is the
    thread still inside it (None when no call is inside: a local queue that stayed full)."""

    def __init__(self, what: str, waited_s: float, worker: threading.Thread | None = None) -> None:
        super().__init__(f"{what} did not return within {waited_s:g} s")
        self.what = what
        self.worker = worker


def bounded(what: str, call: Callable[[], T], timeout_s: float) -> T:
    """`call()` on a helper thread; StuckCallError if it has not returned within `timeout_s`
    plus CALL_GRACE_S (the helper is then abandoned, still running). The waiting thread stays
    responsive (signal handlers run), and a stuck call is abandoned instead of holding the
    process."""
    limit = timeout_s + CALL_GRACE_S
    box: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            box.append((True, call()))
        except BaseException as exc:  # handed to the waiting thread, raised there
            box.append((False, exc))

    worker = threading.Thread(target=target, name=f"codeclog-{what}", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive() or not box:
        raise StuckCallError(what, limit, worker)
    ok, value = box.pop()
    if ok:
        result: T = value
        return result
    try:
        raise value
    finally:
        # The exception's traceback holds this frame: left in `value` it would be a reference
        # cycle, and whatever `call` holds (a producer: its threads and sockets) would live
        # until the cyclic collector's next full pass, which a large heap makes rare.
        del value


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError inside a KafkaException, if there is one."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return error if isinstance(error, KafkaError) else None


def raise_if_denied(exc: BaseException) -> None:
    """KafkaAccessError (a configuration error, exit 2) for an authorization or authentication
    failure no ACL-aware refusal named (codeclog.kafka.access.refusal does, with the principal
    and resource, where it can): no retry helps."""
    error = kafka_error(exc)
    if error is not None and error.code() in DENIED_CODES:
        raise KafkaAccessError(
            f"not allowed by the cluster: {one_line(exc)} (check the ACLs and credentials "
            "of the group, its topics and its transactional id)"
        ) from exc


def one_line(exc: BaseException) -> str:
    """An exception as one line (librdkafka messages can span several); a KafkaError as its
    name and message, not its repr."""
    error = kafka_error(exc)
    text = f"{error.name()}: {error.str()}" if error is not None else str(exc)
    return " ".join((text or type(exc).__name__).split())
