"""Access errors a user can cause (wrong password, unknown user, untrusted certificate, plaintext
against TLS, a missing ACL), each one line naming principal, resource and operation, exit 2,
and the one probe that finds them first. Reasons: docs/security.md, "Refusals"."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from codeclog.errors import UsageError

PROBE_TIMEOUT_S = 10.0
PROBE_ATTEMPT_S = 1.5
# A plaintext client on a TLS port: the broker closes the connection at the first request.
_PLAINTEXT_ON_TLS = "APIVERSION_QUERY"
AUTHORIZATION_CODES = {
    "TOPIC_AUTHORIZATION_FAILED": "topic",
    "GROUP_AUTHORIZATION_FAILED": "group",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "transactional id",
    "CLUSTER_AUTHORIZATION_FAILED": "cluster",
}


class KafkaAccessError(UsageError):
    """The cluster refused who we are or what we asked: a configuration error (exit 2)."""


class KafkaAuthenticationError(KafkaAccessError):
    """Wrong password, unknown user, untrusted certificate, wrong security.protocol."""


class KafkaAuthorizationError(KafkaAccessError):
    """A request was refused by the authorizer (no ACL allows it)."""


def principal_of(config: Mapping[str, Any]) -> str:
    """The principal the broker sees for these properties, as Kafka writes it."""
    user = config.get("sasl.username")
    if user:
        return f"User:{user}"
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    return "User:ANONYMOUS" if protocol in ("plaintext", "ssl") else "an unnamed principal"


def refused_kind(error: Any) -> str | None:
    """ "topic", "group", "transactional id" or "cluster" for an authorisation refusal."""
    return AUTHORIZATION_CODES.get(error.name()) if is_authorization_error(error) else None


def refusal_of_unused(error: Any, needs: Iterable[str]) -> bool:
    """True for an authorisation refusal of a resource kind (`refused_kind`) the reader does
    not use, e.g. an assign()-only reader's group id: librdkafka sends FindCoordinator for it
    although the reader commits nothing, and a least-privilege role may be refused that."""
    kind = refused_kind(error)
    return kind is not None and kind not in needs


def is_authorization_error(error: Any) -> bool:
    """True for a KafkaError (or anything with `name()`) that is an authorisation refusal."""
    name = getattr(error, "name", None)
    return callable(name) and name() in AUTHORIZATION_CODES


def authorization_error(
    config: Mapping[str, Any], operation: str, resource: str, error: Any = None
) -> KafkaAuthorizationError:
    """`resource` as Kafka names it, e.g. "topic codec.audio" or "group codeclog-vocoder"."""
    code = f" ({error.name()})" if error is not None and hasattr(error, "name") else ""
    return KafkaAuthorizationError(
        f"{principal_of(config)} is not authorised to {operation} {resource}{code}; grant it "
        "with `codeclog acls apply` (README, Security) or use the properties of the role that "
        "owns it"
    )


def hidden_topic_hint(config: Mapping[str, Any]) -> str:
    """What to add to 'topic X does not exist' on a secured cluster: metadata lists only the
    topics the principal may DESCRIBE."""
    if not config.get("sasl.username"):
        return ""
    return f" (or {principal_of(config)} may not DESCRIBE it: metadata hides such topics)"


def probe_access(
    config: Mapping[str, Any],
    timeout_s: float = PROBE_TIMEOUT_S,
    factory: Callable[[dict[str, Any]], Any] | None = None,
) -> None:
    """Raise KafkaAuthenticationError when the cluster refuses these credentials or this TLS
    setup; return silently when it answers, and also when it is merely unreachable (each
    command reports that itself). At most `timeout_s`, one attempt for plaintext."""
    from confluent_kafka import KafkaException, Producer

    errors: list[Any] = []
    logs: list[str] = []
    settings: dict[str, Any] = dict(config)
    settings["error_cb"] = errors.append
    settings["logger"] = _Collector(logs)
    settings.setdefault("socket.connection.setup.timeout.ms", int(timeout_s * 1000))
    client = (factory or Producer)(settings)
    secured = str(config.get("security.protocol", "plaintext")).lower() != "plaintext"
    deadline = time.monotonic() + (timeout_s if secured else PROBE_ATTEMPT_S)
    while True:
        try:
            client.list_topics(timeout=PROBE_ATTEMPT_S)
            return
        except KafkaException:
            pass
        client.poll(0)
        refusal = _refusal(config, errors, logs)
        if refusal is not None:
            raise KafkaAuthenticationError(refusal)
        if time.monotonic() >= deadline or _unreachable(logs):
            return


def _refusal(config: Mapping[str, Any], errors: list[Any], logs: list[str]) -> str | None:
    bootstrap = config.get("bootstrap.servers", "?")
    for error in errors:
        name = error.name()
        if name == "_AUTHENTICATION":
            mechanism = config.get("sasl.mechanism", "GSSAPI")
            return (
                f"{principal_of(config)} could not authenticate to {bootstrap} with "
                f"{mechanism}: wrong password or unknown user ({_reason(error.str())})"
            )
        if name == "_SSL":
            return (
                f"TLS to {bootstrap} failed for {principal_of(config)}: the broker certificate "
                f"does not verify against ssl.ca.location={config.get('ssl.ca.location', '?')} "
                f"({_reason(error.str())})"
            )
    secured = str(config.get("security.protocol", "plaintext")).lower() != "plaintext"
    closed = [line for line in logs if _PLAINTEXT_ON_TLS in line and "Disconnected" in line]
    if not secured and closed:
        return (
            f"{bootstrap} closed the connection at the first request from a plaintext client: "
            "it is probably a TLS/SASL listener; pass --kafka-config with security.protocol, "
            "sasl.* and ssl.* (e.g. a role file of `codeclog broker start --security scram`)"
        )
    return None


def _unreachable(logs: list[str]) -> bool:
    return any("Connection refused" in line or "resolve" in line for line in logs)


def _reason(text: str) -> str:
    # "sasl_ssl://h:p/bootstrap: SASL authentication error: X (after 3ms in state Y)" -> X
    text = text.split("/bootstrap: ", 1)[-1]
    text = text.split(" (after ", 1)[0]
    return " ".join(text.split())[:240]


class _Collector(logging.Logger):
    """A logger that keeps librdkafka's log lines instead of printing them."""

    def __init__(self, sink: list[str]) -> None:
        super().__init__("codeclog.kafka.probe", logging.DEBUG)
        self._sink = sink
        self.propagate = False

    def handle(self, record: logging.LogRecord) -> None:
        self._sink.append(record.getMessage())


def raise_if_topic_refused(config: Mapping[str, Any], topic: str, timeout_s: float = 10.0) -> None:
    """For a topic missing from the whole-cluster metadata: ask for it by name (auto-creation
    off) and raise KafkaAuthorizationError when the broker says the principal may not DESCRIBE
    it, so the user is not told that an existing topic does not exist."""
    from confluent_kafka import KafkaException, Producer

    if not config.get("sasl.username"):
        return
    settings: dict[str, Any] = {**config, "allow.auto.create.topics": False, "log_level": 2}
    settings["logger"] = _Collector([])
    try:
        found = Producer(settings).list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    except KafkaException:
        return
    if found is not None and found.error is not None and is_authorization_error(found.error):
        raise authorization_error(
            config, "DESCRIBE", f"topic {topic} (Kafka does not say whether it exists)", found.error
        )


def refusal(
    error_or_exc: Any, config: Mapping[str, Any] | None, doing: Mapping[str, str]
) -> KafkaAuthorizationError | None:
    """The KafkaAuthorizationError for a KafkaError (or a KafkaException carrying one) that is
    an authorisation refusal, else None. `doing` maps the error's resource kind ("topic",
    "group", "transactional id", "cluster") to "OPERATION resource" for the message; the
    broker's own words are kept when the kind is not in it."""
    error = error_or_exc
    if not hasattr(error, "name") and getattr(error_or_exc, "args", None):
        error = error_or_exc.args[0]
    if not is_authorization_error(error):
        return None
    kind = AUTHORIZATION_CODES[error.name()]
    what = doing.get(kind) or f"{kind} access ({' '.join(str(error.str()).split())[:200]})"
    operation, _, resource = what.partition(" ")
    return authorization_error(config or {}, operation, resource, error)
