"""What every refused wire value must show, for the tables of crafted and forged values."""

from __future__ import annotations

import pytest

from codeclog.schemas import wire


def assert_refused(data: bytes | None, reason: str) -> None:
    """wire.decode refuses `data` with `reason`, carrying the value as it came (b"" for None)
    and naming no fingerprint but the one in its header."""
    with pytest.raises(wire.DecodeError) as caught:
        wire.decode(data)
    assert caught.value.reason.value == reason
    assert caught.value.raw == (data or b"")
    assert wire.wire_fingerprint(data) in (None, (data or b"")[2:10])
