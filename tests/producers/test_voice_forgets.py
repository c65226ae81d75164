"""The dev tools' talker (`Voice`, the fault matrix's and the soak's, round after round for an
hour) keeps no state per finished request: each round's sessions are over when `speak` returns,
and the talker forgets them (issue 43)."""

from __future__ import annotations

from typing import Any

import pytest

from codeclog.devtools import talker as devtools_talker
from codeclog.devtools.talker import Speech, Voice
from codeclog.producers.publisher import PublisherConfig
from codeclog.producers.synthetic import request_id_for


class Publisher:
    """Takes every record, delivers at once."""

    def __init__(self, _client: Any, _config: PublisherConfig) -> None:
        self.published: list[Any] = []

    def publish(self, record: Any) -> None:
        self.published.append(record)


def test_a_voice_forgets_the_sessions_of_every_round_it_spoke(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(devtools_talker, "ChunkPublisher", Publisher)
    voice = Voice({}, PublisherConfig(topic="chunks", producer_id="p"))
    for round_no in range(3):
        assert voice.speak(Speech(4, 3.0, seed=round_no), realtime=False) > 0
    spoken = [request_id_for(seed, i) for seed in range(3) for i in range(4)]
    assert [rid for rid in spoken if voice.talker.state(rid) is not None] == []
