"""The one exception base of codeclog, and the one exit-code rule of every command.

Narrow subclasses live next to the code that raises them. Exit codes (README, "Exit codes"):
0 ok, 1 failure (the cluster did not answer, a record was not delivered, ...), 2 usage or
configuration (a bad option, an unreadable or invalid --kafka-config, a port in use, ...).
"""

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class CodeclogError(Exception):
    """Base of every error codeclog raises on purpose."""


class UsageError(CodeclogError):
    """The user asked for something impossible (options, configuration): exit 2."""


class ConfigError(UsageError):
    """A configuration value is missing, malformed or contradictory."""


def exit_code(exc: BaseException) -> int:
    """The exit code for an error a command could not get past."""
    return EXIT_USAGE if isinstance(exc, UsageError | ValueError) else EXIT_FAILURE
