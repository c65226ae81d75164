"""What goes wrong with a local Kafka broker or a local cluster of them: one class per failure, each
a BrokerError (a CodeclogError: one line and exit 1 from the CLI), also a UsageError when it is
a bad option (exit 2)."""

from __future__ import annotations

from codeclog.errors import CodeclogError, UsageError


class BrokerError(CodeclogError):
    """The local broker could not be started, stopped or inspected."""


class JavaNotFoundError(BrokerError):
    """No `java` executable where we looked."""


class JavaTooOldError(BrokerError):
    """Kafka 4 brokers need Java 17 or newer."""


class BrokerFormatError(BrokerError):
    """`kafka.tools.StorageTool format` failed on the data dir."""


class BrokerStartError(BrokerError):
    """The JVM exited during start-up or did not become ready in time."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class SecurityModeError(BrokerError, UsageError):
    """The data dir was formatted for another security mode than the one asked for."""


class PortInUseError(BrokerStartError):
    """The JVM could not bind a port we picked (lost a race with another process)."""


class ClusterError(BrokerError):
    """The local cluster could not be started, stopped, inspected or faulted."""


class ClusterSizeError(ClusterError, UsageError):
    """--nodes out of range: a bad option (exit 2)."""
