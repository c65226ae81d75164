"""The synthetic talker of the demo, the benchmarks and the tests: codeclog's `Talker` over one
`ChunkPublisher` that lives through the whole run, speaking synthetic duplex sessions either
as fast as possible or in real time (in a background thread: `LiveTalker`)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from codeclog.producers.publisher import ChunkPublisher, CloseReport, PublisherConfig
from codeclog.producers.synthetic import Progress, SyntheticConfig, merged, play, scripts
from codeclog.producers.talker import Talker, wall_clock_ms


@dataclasses.dataclass(frozen=True)
class Speech:
    """What to say: `sessions` seeded synthetic duplex sessions of `seconds` each; `phased`:
    in real time each session steps on its own frame clock (synthetic.due_s), spread over the
    40 ms, instead of all together every frame."""

    sessions: int
    seconds: float
    seed: int
    phased: bool = False


class Voice:
    """A `Talker` over one `ChunkPublisher` (idempotent, acks=all) for a whole run."""

    def __init__(
        self,
        client: Mapping[str, Any],
        config: PublisherConfig,
        now_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.now_ms = now_ms  # the talker's clock (produced_at): the clock-skew fault moves it
        self.publisher = ChunkPublisher(client, config)
        self.talker = Talker(self.publisher, producer_id=config.producer_id, native_duplex=True)
        self.records = 0  # records handed to the publisher so far

    def speak(
        self,
        speech: Speech,
        *,
        realtime: bool,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> int:
        """Play `speech` (in real time, or as fast as possible); the records it published. Its
        sessions are over when it returns: the talker forgets them (a voice that speaks round
        after round for hours keeps no state per finished request)."""
        config = SyntheticConfig(sessions=speech.sessions, seconds=speech.seconds, seed=speech.seed)
        sessions = scripts(config)
        result = play(
            merged(sessions),
            self.talker.apply,
            total_s=speech.seconds,
            realtime=realtime,
            clock=time.monotonic,
            sleep=time.sleep,
            now_ms=self.now_ms,
            on_progress=on_progress,
            phases=speech.sessions if speech.phased else 1,
        )
        for session in sessions:
            self.talker.forget(session.request_id)
        self.records += result.records
        return result.records

    def close(self, timeout_s: float) -> CloseReport:
        """Deliver what the publisher holds within `timeout_s`; the rest counts as failed."""
        return self.publisher.close(timeout_s)

    @property
    def failed(self) -> int:
        """Records the publisher could not deliver (after close: every undelivered one too)."""
        return self.publisher.stats.failed


class TalkerError(RuntimeError):
    """A talker did not deliver every record it published."""


def publish_sessions(
    client: Mapping[str, Any], topic: str, speech: Speech, producer_id: str = "test-talker"
) -> int:
    """`speech` published as fast as possible and delivered (within 30 s); records sent."""
    voice = Voice(client, PublisherConfig(topic=topic, producer_id=producer_id))
    records = voice.speak(speech, realtime=False)
    report = voice.close(30)
    if report.undelivered or voice.failed:
        raise TalkerError(f"{voice.failed} of {records} records not delivered to {topic}")
    return records


class LiveTalker(threading.Thread):
    """A realtime talker in a background thread: `speech` once, or with `repeat` round after
    round (round n seeded speech.seed * 1000 + n) until stop(). With `close_s` the thread
    closes the publisher when it is done (then `failed` is set); else the caller closes
    `voice`. What ends the thread early is kept in `error`, never lost."""

    def __init__(
        self,
        voice: Voice,
        speech: Speech,
        *,
        repeat: bool = False,
        close_s: float | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.voice = voice
        self.speech = speech
        self.repeat = repeat
        self.close_s = close_s
        self.failed: int | None = None  # the publisher's failed deliveries, once it closed
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            self._talk()
        except BaseException as exc:  # reported by the caller
            self.error = exc
        if self.close_s is not None:
            self.voice.close(self.close_s)
            self.failed = self.voice.failed

    def _talk(self) -> None:
        if not self.repeat:
            self.voice.speak(self.speech, realtime=True)
            return
        round_no = 0
        while not self.halt.is_set():
            seed = self.speech.seed * 1000 + round_no
            self.voice.speak(dataclasses.replace(self.speech, seed=seed), realtime=True)
            round_no += 1

    def stop(self, timeout_s: float) -> None:
        """No new round; wait up to `timeout_s` for the current one to end."""
        self.halt.set()
        if self.ident is not None:  # a run that failed before the talker started: no wait
            self.join(timeout_s)

    @property
    def delivered_everything(self) -> bool:
        """Done, closed, no error, and every record delivered."""
        return not self.is_alive() and self.error is None and self.failed == 0
