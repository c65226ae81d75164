"""The talker hook for vllm-omni: a stage input processor that publishes to Kafka.

`tts2code2wav_kafka` has the signature of the upstream `tts2code2wav_async_chunk` (MiniCPM-o 4.5)
and is configured in its place (`custom_process_next_stage_input_func`, README "Use from
vllm-omni"). It windows the talker's codec ids exactly as the upstream producer does
(`producers.windowing`), publishes the records with `ChunkPublisher` and returns None: nothing
goes over the in-process connector, Code2Wav (`codeclog vocode`) reads Kafka.

The failure rule: the hook never raises (the upstream adapter would log and silently drop the
chunk). A chunk that cannot be published or delivered counts as a failure of its request:
logged, counted in `failures_by_request`, and kept in the publisher's `failures`.

Nothing here imports vllm or torch: tensors are read through `reshape`/`tolist`.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from codeclog.producers.publisher import ChunkPublisher, DeliveryFailure, PublisherConfig, Talker

LOGGER = logging.getLogger("codeclog.talker")
ABORT_MARKS = ("ABORT", "CANCEL", "IGNORED", "ERROR")


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

    def __init__(self, publisher: Any, talker: Talker | None = None) -> None:
        self.publisher = publisher
        self.talker = talker or Talker(publisher, producer_id=publisher.config.producer_id)
        self.failures_by_request: Counter[str] = Counter()
        self.calls = 0

    def record_failure(self, failure: DeliveryFailure) -> None:
        """ChunkPublisher's on_failure: an undeliverable record fails its request."""
        self.failures_by_request[failure.request_id] += 1
        LOGGER.error(
            "chunk of request %s (epoch %s, seq %s) not delivered: %s %s",
            failure.request_id,
            failure.cache_epoch,
            failure.chunk_seq,
            failure.error_name,
            failure.error,
        )

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
            self._step(request_id, multimodal_output, request, is_finished)
        except Exception as exc:  # never into the engine: the chunk fails its request instead
            self.failures_by_request[request_id] += 1
            LOGGER.error("talker step of request %s not published: %s", request_id, exc)
        try:
            self.publisher.poll(0)  # serve delivery reports on steps that publish nothing
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
