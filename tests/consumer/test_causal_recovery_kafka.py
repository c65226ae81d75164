"""A member of the other HiFT variant refuses to rebuild streams a causal member checkpointed,
on the real broker: one line, exit 2, before anything is decoded."""

from __future__ import annotations

from typing import Any

import pytest

from codeclog.consumers.member.service import VocodeConfig, VocoderService
from codeclog.consumers.stream.engine import EngineMismatchError
from codeclog.errors import exit_code
from codeclog.schemas import wire
from codeclog.schemas.records import CodecChunk

pytestmark = [pytest.mark.kafka, pytest.mark.vocoder, pytest.mark.slow]
SILENCE = (4218,) * 3


# ~20 s (two members' group joins and idle waits); CI covers the same refusal on
# Recovery._rebuild itself: tests/consumer/test_engine_fit.py::
# test_recovery_refuses_a_causal_stream_before_decoding_anything
@pytest.mark.long
def test_a_noncausal_member_refuses_the_open_streams_of_a_causal_member(
    stack: Any, tiny_engine: Any
) -> None:
    from codeclog.vocoder.engine import Code2WavEngine

    rid = "open-1"
    chunks = [  # two windows, no last chunk: the stream stays open, its checkpoint names it
        CodecChunk(rid, SILENCE + tuple(range(100, 125)), 0, 0, 28, 25, 3),
        CodecChunk(rid, tuple(range(122, 150)), 0, 1, 28, 25, 3),
    ]
    stack.publish_raw([(rid.encode(), wire.encode(chunk)) for chunk in chunks])
    config = VocodeConfig(group=stack.group, exit_when_idle_s=3.0)
    causal = Code2WavEngine.from_spec("tiny", hift="causal")
    VocoderService(stack.client, stack.topics, config, causal).run()
    with pytest.raises(EngineMismatchError) as refused:
        VocoderService(stack.client, stack.topics, config, tiny_engine).run()
    assert exit_code(refused.value) == 2
    assert f"request {rid}: its checkpoint was written by a causal HiFT engine" in str(
        refused.value
    )
    assert "run it with --hift causal" in str(refused.value)
