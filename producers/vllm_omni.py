"""The talker hook for vllm-omni: a stage input processor that publishes to Kafka and never raises.
Its failure rule: docs/vllm-omni.md, "The talker hook"."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from codeclog.producers.publisher import ChunkPublisher, DeliveryFailure, PublisherConfig
from codeclog.producers.talker import Talker, wall_clock_ms
from codeclog.schemas.records import ControlEvent, ControlKind

LOGGER = logging.getLogger("codeclog.talker")
ABORT_MARKS = ("ABORT", "CANCEL", "IGNORED", "ERROR")
ABORT_KIND = f"control_event:{ControlKind.ABORT.value}"
FAILED_REQUESTS_KEPT = 10_000  # failed request ids remembered (their later steps are dropped)


def _ints(value: Any) -> list[int]:
    if value is None:
        return []
    items: Iterable[Any] = value.reshape(-1).tolist() if hasattr(value, "reshape") else value
    return [int(v) for v in items]


def _one(value: Any, default: int) -> int:
    items = _ints(value)
    return items[0] if items else default


class TalkerHook:
    """The stage input processor, bound to one publisher and talker."""

    def __init__(
        self,
        publisher: Any,
        talker: Talker | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.publisher = publisher
        self.talker = talker or Talker(publisher, producer_id=publisher.config.producer_id)
        self.failures_by_request: Counter[str] = Counter()
        self.calls = 0
        self.dropped_steps = 0  # steps of failed requests, not published
        self.aborts_published = 0
        self._clock_ms = clock_ms
        self._failed: dict[str, None] = {}  # failed request ids, oldest first (bounded)
        self._aborts_due: dict[str, None] = {}  # ABORT records still to publish

    @property
    def failed_requests(self) -> int:
        return len(self._failed)

    def record_failure(self, failure: DeliveryFailure) -> None:
        """ChunkPublisher's on_failure: an undeliverable record fails its request."""
        rid = failure.request_id
        if failure.kind == ABORT_KIND:  # the stream must still end on the log: again later
            LOGGER.warning("abort of request %s not delivered yet: retrying", rid)
            self._aborts_due[rid] = None
            return
        self.failures_by_request[rid] += 1
        LOGGER.error(
            "%s of request %s (epoch %s, seq %s) not delivered: %s %s",
            failure.kind,
            rid,
            failure.cache_epoch,
            failure.chunk_seq,
            failure.error_name,
            failure.error,
        )
        self._fail_request(rid)

    def _fail_request(self, rid: str) -> None:
        if rid in self._failed:
            return
        LOGGER.error("request %s failed: its audio stream is aborted on the log", rid)
        self._failed[rid] = None
        while len(self._failed) > FAILED_REQUESTS_KEPT:
            del self._failed[next(iter(self._failed))]
        self._aborts_due[rid] = None

    def _publish_aborts(self) -> None:
        """The ABORT of every failed request (queued until the cluster is back)."""
        for rid in list(self._aborts_due):
            del self._aborts_due[rid]
            abort = ControlEvent(
                request_id=rid,
                kind=ControlKind.ABORT,
                reason="talker: records of this request could not be delivered",
                produced_at_ms=self._clock_ms(),
                producer_id=self.talker.producer_id,
            )
            try:
                self.publisher.publish(abort)
            except Exception as exc:  # still no room or no cluster: the next step tries again
                LOGGER.warning("abort of failed request %s not queued yet: %s", rid, exc)
                self._aborts_due[rid] = None
                return
            self.aborts_published += 1

    def __call__(
        self,
        transfer_manager: Any,
        multimodal_output: Mapping[str, Any],
        request: Any,
        is_finished: bool = False,
    ) -> None:
        self.calls += 1
        request_id = "?"
        try:
            request_id = str(
                getattr(request, "external_req_id", None) or getattr(request, "request_id", "")
            )
            if request_id in self._failed:
                self.dropped_steps += 1  # the request already failed: nothing more of it
            else:
                self._step(request_id, multimodal_output, request, is_finished)
        except Exception as exc:  # never into the engine: the chunk fails its request instead
            self.failures_by_request[request_id] += 1
            LOGGER.error("talker step of request %s not published: %s", request_id, exc)
            self._fail_request(request_id)
        try:
            self.publisher.poll(0)  # serve delivery reports on steps that publish nothing
            self._publish_aborts()
        except Exception as exc:
            LOGGER.error("serving delivery reports failed: %s", exc)
        return None

    def _step(
        self, request_id: str, output: Mapping[str, Any], request: Any, is_finished: bool
    ) -> None:
        meta = output.get("meta") or {}
        valid = meta.get("codec_frame_valid")
        status = getattr(getattr(request, "status", None), "name", "") or ""
        done = getattr(request, "is_finished", None)
        self.talker.step(
            request_id,
            _ints((output.get("codes") or {}).get("audio")),
            segment_finished=bool(is_finished),  # the adapter's is_segment_finished or finished
            finished=bool(callable(done) and done()),
            turn_end=bool(_one(meta.get("turn_end"), 0)),
            native_duplex=bool(_one(meta.get("native_duplex"), 0)),
            aborted=any(mark in status for mark in ABORT_MARKS),
            text_utf8=bytes(_ints(meta.get("llm_output_text_utf8"))),
            duplex_epoch=_one(meta.get("duplex_epoch"), -1),
            duplex_turn_id=_one(meta.get("duplex_turn_id"), -1),
            internal_request_id=str(getattr(request, "request_id", request_id)),
            codec_frame_valid=None if valid is None else [bool(v) for v in _ints(valid)],
        )

    def forget(self, request_id: str) -> None:
        """Drop a request's windowing state (call from the engine's request-cleanup hook)."""
        try:
            self.talker.forget(request_id)
            self._failed.pop(request_id, None)
        except Exception as exc:
            LOGGER.error("forgetting request %s failed: %s", request_id, exc)


def from_environment(
    publisher_factory: Callable[..., Any] = ChunkPublisher,
) -> TalkerHook:
    """A hook publishing to $CODECLOG_TOPIC (codec.chunks) at $CODECLOG_BOOTSTRAP."""
    hook: TalkerHook | None = None

    def on_failure(failure: DeliveryFailure) -> None:
        if hook is not None:
            hook.record_failure(failure)

    config = PublisherConfig(
        os.environ.get("CODECLOG_TOPIC", "codec.chunks"),
        producer_id=f"talker-{socket.gethostname()}-{os.getpid()}",
    )
    client = {"bootstrap.servers": os.environ.get("CODECLOG_BOOTSTRAP", "127.0.0.1:9092")}
    publisher = publisher_factory(client, config, on_failure=on_failure)
    hook = TalkerHook(publisher)
    atexit.register(publisher.close, 10.0)
    return hook


_default: TalkerHook | None = None
_default_lock = threading.Lock()


def default_hook() -> TalkerHook:
    global _default
    with _default_lock:
        if _default is None:
            _default = from_environment()
        return _default


def tts2code2wav_kafka(
    transfer_manager: Any,
    multimodal_output: Mapping[str, Any],
    request: Any,
    is_finished: bool = False,
) -> None:
    """The stage input processor to configure in vllm-omni (publishes; returns None)."""
    try:
        hook = default_hook()
    except Exception as exc:  # no publisher (bad config): every chunk fails, nothing raises
        LOGGER.error("codeclog talker hook unavailable: %s", exc)
        return None
    return hook(transfer_manager, multimodal_output, request, is_finished)
