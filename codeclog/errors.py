"""The one exception base of codeclog, and every exit code of every command, defined here once.
Reasons: README, "Exit codes"."""

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DIFFERENT = 1  # `diff`: the inputs differ
EXIT_BROKER_STOPPED = 3  # `broker status`: every node is stopped
EXIT_STRICT_FATAL = 3  # `vocode --policy strict`: the upstream stage would have died here
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_BROKEN_PIPE = 141  # the reader of stdout left (`| head`): 128 + SIGPIPE, quietly


class CodeclogError(Exception):
    """Base of every error codeclog raises on purpose. A subclass whose exit code is its
    own (not 1 or 2) names it in EXIT_CODE."""

    EXIT_CODE: int | None = None


class UsageError(CodeclogError):
    """The user asked for something impossible (options, configuration): exit 2."""


class ConfigError(UsageError):
    """A configuration value is missing, malformed or contradictory."""


def exit_code(exc: BaseException) -> int:
    """The exit code for an error a command could not get past."""
    own = getattr(exc, "EXIT_CODE", None)
    if isinstance(own, int):
        return own
    return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILURE
