"""Smoke test on a real Token2wav checkpoint (MiniCPM-o 4.5 `assets/token2wav`).

Runs only when CODECLOG_TOKEN2WAV_DIR points at the directory (flow.yaml, flow.pt, hift.pt or the
1.0.7 layout). On a GPU box set CODECLOG_TOKEN2WAV_DEVICE=cuda. Checks: strict loading, three
25+3 windows with the default voice, finite non-silent audio of the documented lengths.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from codeclog.vocoder.engine import Code2WavEngine, stream_seed
from codeclog.vocoder.flow import canonical_windows

pytestmark = [pytest.mark.vocoder, pytest.mark.slow]
CHECKPOINT = os.environ.get("CODECLOG_TOKEN2WAV_DIR")


@pytest.mark.skipif(not CHECKPOINT, reason="CODECLOG_TOKEN2WAV_DIR is not set")
def test_real_checkpoint_streams_three_windows() -> None:
    assert CHECKPOINT is not None
    device = os.environ.get("CODECLOG_TOKEN2WAV_DEVICE", "cpu")
    engine = Code2WavEngine.load(CHECKPOINT, device=device)
    ids = [4218] * 3 + [(i * 7919 + 13) % 6561 for i in range(60)]
    state = engine.setup(seed=stream_seed("real-weights", 0))
    sizes = []
    for window, final in canonical_windows(ids):
        [(audio, state)] = engine.decode_batch([(state, window, final)])
        assert np.isfinite(audio).all()
        sizes.append(len(audio))
    assert sizes == [20160, 24000, 13 * 960 + 3840]
    assert float(np.abs(audio).max()) > 1e-4
