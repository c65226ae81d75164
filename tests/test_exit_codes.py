"""`codeclog.errors.exit_code`: 2 only for the project's own usage errors, so an internal bug
(a ValueError inside codeclog) never reads as the user's mistake."""

from __future__ import annotations

import pytest

from codeclog.errors import (
    EXIT_FAILURE,
    EXIT_STRICT_FATAL,
    EXIT_USAGE,
    CodeclogError,
    ConfigError,
    UsageError,
    exit_code,
)
from codeclog.producers.publisher import PublisherConfigError
from codeclog.producers.synthetic import SyntheticConfigError
from codeclog.producers.windowing import InvalidStepError, WindowingConfigError


class _BugLike(CodeclogError, ValueError):
    """A codeclog error that is also a ValueError, not a usage error."""


class _Own(CodeclogError):
    EXIT_CODE = EXIT_STRICT_FATAL


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UsageError("bad option"), EXIT_USAGE),
        (ConfigError("bad value"), EXIT_USAGE),
        (PublisherConfigError("linger"), EXIT_USAGE),
        (SyntheticConfigError("rate"), EXIT_USAGE),
        (WindowingConfigError("chunk"), EXIT_USAGE),
        (InvalidStepError("empty request id"), EXIT_FAILURE),  # bad data, not bad usage
        (_BugLike("internal"), EXIT_FAILURE),
        (ValueError("internal"), EXIT_FAILURE),
        (CodeclogError("the cluster did not answer"), EXIT_FAILURE),
        (_Own("strict"), EXIT_STRICT_FATAL),
    ],
)
def test_only_usage_errors_exit_2(error: BaseException, code: int) -> None:
    assert exit_code(error) == code


def test_config_errors_stay_value_errors_for_their_callers() -> None:
    for error in (PublisherConfigError("x"), SyntheticConfigError("x"), WindowingConfigError("x")):
        assert isinstance(error, ValueError) and isinstance(error, UsageError)
