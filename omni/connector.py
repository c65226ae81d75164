"""`CodeclogKafkaConnector`: a vllm-omni OmniConnector on a durable Kafka topic; a subclass of
`OmniConnectorBase` (its context manager and destructor too) where `vllm_omni` imports, a plain
class otherwise. Guide: docs/vllm-omni.md, "Mode 1"."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from codeclog.omni.receiver import Receiver
from codeclog.omni.sender import Sender
from codeclog.omni.settings import read_settings
from codeclog.omni.tally import Tally

LOGGER = logging.getLogger("codeclog.omni")
NAME = "CodeclogKafkaConnector"
BASE_MODULE = "vllm_omni.distributed.omni_connectors.connectors.base"


def _connector_base() -> type:
    """vllm-omni's `OmniConnectorBase` when vllm_omni is importable, else `object`."""
    if importlib.util.find_spec("vllm_omni") is None:
        return object
    try:
        module = importlib.import_module(BASE_MODULE)
    except Exception as exc:  # an installation vLLM itself could not run either
        LOGGER.warning("vllm_omni is installed but %s does not import: %s", BASE_MODULE, exc)
        return object
    base = getattr(module, "OmniConnectorBase", object)
    return base if isinstance(base, type) else object


if TYPE_CHECKING:
    _Base = object
else:
    _Base = _connector_base()


class CodeclogKafkaConnector(_Base):
    """An OmniConnector whose transport is a Kafka topic (docs/vllm-omni.md, "Mode 1").

    put (omni.sender): one record keyed by the external request id of the put key, (True,
    size, metadata) only after the broker acknowledged it, else (False, 0, None); it never
    raises, and an instance that also receives indexes its own put at once. get and
    get_with_deadline (omni.receiver): served from an in-memory index (omni.index) that a
    background consumer fills (read_committed, one group per replica with static membership,
    started with the connector unless its role is "sender"); get never blocks,
    get_with_deadline waits until the monotonic deadline at most; a key is handed out once. A
    request ends here when its terminal payload is handed out, when it fails or at `cleanup`,
    and each ending goes on the edge's hand-out ledger (omni.ledger). health(): counters, lag,
    last error; close(): flushes the producer and stops the consumer thread; idempotent."""

    supports_raw_data = False  # payloads go through omni.payload, not raw RDMA buffers

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self.settings = read_settings(self.config)
        self.stage_id = self.settings.stage_id  # the adapter computes +1 / -1
        self.role = self.settings.role
        self.topic = self.settings.topic
        self.replica_id = self.settings.replica_id
        self.group_id = self.settings.group_id
        self.codec_edge = self.settings.codec_edge
        self.producer_id = self.settings.producer_id
        self._tally = Tally()
        self._sender = Sender(self.settings, self._tally)
        self._receiver = Receiver(self.settings, self._tally, self._sender)
        self._closed = False
        if self.settings.receives:
            self._receiver.start()  # caught up by the time the adapter polls its first key

    @property
    def last_error(self) -> str:
        return self._tally.last_error

    # ------------------------------------------------------------------------------------- put
    def put(
        self, from_stage: str, to_stage: str, put_key: str, data: Any
    ) -> tuple[bool, int, dict[str, Any] | None]:
        try:
            if self._closed:
                self._tally.failed("put", str(put_key), "the connector is closed")
                return False, 0, None
            put = self._sender.put(str(from_stage), str(to_stage), str(put_key), data)
        except Exception as exc:  # never raise into the engine
            self._tally.failed("put", str(put_key), f"{type(exc).__name__}: {exc}")
            return False, 0, None
        if put is None:
            return False, 0, None
        if self.settings.receives:  # this instance receives too: its own put is readable now
            self._receiver.own_put(put)
        metadata = {
            "topic": self.topic,
            "partition": put.partition,
            "offset": put.offset,
            "record": put.encoded.record_type,
        }
        return True, put.encoded.size, metadata

    # ------------------------------------------------------------------------------------- get
    def get(
        self, from_stage: str, to_stage: str, get_key: str, metadata: dict[str, Any] | None = None
    ) -> tuple[Any, int] | None:
        try:
            self._receiver.start()
            return self._receiver.take((str(get_key), str(from_stage), str(to_stage)))
        except Exception as exc:
            self._tally.failed("get", str(get_key), f"{type(exc).__name__}: {exc}")
            return None

    def get_with_deadline(
        self,
        from_stage: str,
        to_stage: str,
        get_key: str,
        metadata: dict[str, Any] | None = None,
        *,
        deadline: float,
    ) -> tuple[Any, int] | None:
        try:
            self._receiver.start()
            key = (str(get_key), str(from_stage), str(to_stage))
            return self._receiver.take_by(key, deadline)
        except Exception as exc:
            self._tally.failed("get", str(get_key), f"{type(exc).__name__}: {exc}")
            return None

    def abandon_get(self, get_key: str) -> None:
        return None

    def reap_consumed(self) -> None:
        return None

    def cleanup(self, request_id: str) -> bool:
        """Forget a request (its id), or one put key (vllm-omni 0.30's shared-memory form)."""
        self._receiver.forget(str(request_id))
        self._tally.add("cleanups")
        return True

    def bind_adapter(self, adapter: Any) -> None:
        """The chunk adapter that owns this connector (omni.plugin binds it in vLLM
        processes): a request the receiver fails ends through the adapter's
        receive-failure path, as FINISHED_ERROR with the reason."""
        self._receiver.bind(adapter)

    # ------------------------------------------------------------------------------- lifecycle
    def health(self) -> dict[str, Any]:
        failures = self._tally.failures()
        status = "closed" if self._closed else ("degraded" if failures else "ok")
        return {
            "status": status,
            "connector": NAME,
            "topic": self.topic,
            "group_id": self.group_id,
            "instance_id": self.settings.instance_id,
            "role": self.role,
            "stage_id": self.stage_id,
            "replica_id": self.replica_id,
            "in_flight": self._sender.in_flight,
            "failures": failures,
            "last_error": self._tally.last_error,
            **self._receiver.health(),
            **self._tally.counts(),
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._receiver.close()
        left = self._sender.close()
        if left:
            LOGGER.error("codeclog connector closed with %d undelivered records", left)

    def __enter__(self) -> CodeclogKafkaConnector:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
