"""vllm-omni's own CPU connector tests, with codeclog's connector in the connector's place.

Upstream tests the chunk adapter (tests/distributed/omni_connectors/test_chunk_transfer_adapter.py)
with a MagicMock connector and the connectors themselves (test_basic_connectors.py) on
SharedMemoryConnector. Here each case that goes through a connector runs on the released
0.30.0 adapter with a real connector on each side of the edge, built by the real factory from
the stage connector spec (`create_connector` and `resolve_connector_spec`, as a stage worker builds
it): `CodeclogKafkaConnector` on a real broker, and `SharedMemoryConnector`, the connector
upstream's cases are written for, as the baseline in the same test. A case's upstream name is in
its docstring; what it asserts of the adapter is upstream's, adapted to 0.30.0's adapter (a
registration is a `_LoadEntry`; the "ar" receive path keeps the payload for the scheduler in
`_pending_ar_prompt_updates`), and the payload the adapter committed must be the same with
either connector. The adapter's background threads are stopped at once, so the test drives its
poll and send by hand, as upstream's fixture does by faking the base constructor.

Not carried over: the cases with no connector in them (queues, promotion, schedulers, cleanup of
the adapter's own dicts) and the transport-specific ones (SHM segments and their mocks,
Mooncake, MoRI): they test vllm-omni, not the connector in its place.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pipeline as edge
import pytest
import torch
from vllm.v1.request import RequestStatus
from vllm_omni.data_entry_keys import CodesStruct, MetaStruct, OmniPayloadStruct, to_dict
from vllm_omni.distributed.omni_connectors.connectors.shm_connector import SharedMemoryConnector
from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory
from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
    OmniChunkTransferAdapter,
)
from vllm_omni.distributed.omni_connectors.utils.config import ConnectorSpec
from vllm_omni.distributed.omni_connectors.utils.initialization import resolve_connector_spec

from codeclog.omni.connector import CodeclogKafkaConnector

KAFKA, SHM = "CodeclogKafkaConnector", "SharedMemoryConnector"
# CodeclogKafkaConnector twice: as any edge's connector (payloads as PayloadEnvelope records),
# and with the MiniCPM-o codec extras of the talker -> Code2Wav edge (`codec_edge`: a payload
# with codes.audio rides on a CodecChunk record, one without on a FINISH control event)
EDGES = {SHM: {}, KAFKA: {}, f"{KAFKA}+codec_edge": edge.CODEC_EXTRA}
WAIT_S = 30.0


def _same(a: Any, b: Any) -> bool:
    """Equal trees: tensors by dtype, shape and values; arrays by dtype and values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(type(a) is type(b) and a == b)


def _req(req_id: str, status: RequestStatus, external_req_id: str) -> edge.Request:
    """Upstream's `_req`: the fields the adapter reads of a vLLM request."""
    return edge.request(
        req_id,
        external_req_id,
        status=status,
        num_prompt_tokens=0,
        prefill_stats=None,
        client_index=0,
    )


class Edge:
    """Builds adapters with real connectors on one edge, and the peer stage's connectors."""

    def __init__(self, kind: str, bootstrap: str, topic: str) -> None:
        self.name = kind.split("+")[0]
        self.edge_extra = EDGES[kind]
        self.bootstrap = bootstrap
        self.topic = topic
        self.run = uuid.uuid4().hex[:8]
        self.adapters: list[OmniChunkTransferAdapter] = []
        self.connectors: list[Any] = []

    def extra(self, more: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if self.name == SHM:
            return {"connector_get_sleep_s": 0.01, **(more or {})}
        group = {"group_id": f"upstream-{uuid.uuid4().hex[:8]}"}  # its own group each
        topic = {"bootstrap": self.bootstrap, "topic": self.topic}
        return {**topic, **self.edge_extra, **group, **(more or {})}

    def ext(self, name: str) -> str:
        """An external request id unique to this run (the topic outlives one test's keys)."""
        return f"{name}-{self.run}"

    def adapter(
        self,
        *,
        stage_id: int = 1,
        model_mode: str = "ar",
        max_num_seqs: int = 2,
        active_stream_window: int = 0,
        connector_extra: Mapping[str, Any] | None = None,
    ) -> OmniChunkTransferAdapter:
        """Upstream's `build_adapter`, its connector the real one of `self.name`."""
        model_config = SimpleNamespace(
            stage_id=stage_id,
            worker_type=model_mode,
            max_num_seqs=max_num_seqs,
            active_stream_window=active_stream_window,
            async_chunk=True,
            max_model_len=4096,
            stage_connector_config={"name": self.name, "extra": self.extra(connector_extra)},
        )
        scheduler_config = SimpleNamespace(max_num_seqs=max_num_seqs)
        adapter = OmniChunkTransferAdapter(
            SimpleNamespace(model_config=model_config, scheduler_config=scheduler_config)
        )
        self.adapters.append(adapter)
        assert type(adapter.connector).__name__ == self.name
        # the test drives poll and send by hand: the base's loops stop at once
        adapter.stop_event.set()
        for cond in (adapter._recv_cond, adapter._save_cond):
            with cond:
                cond.notify_all()
        adapter.recv_thread.join(5)
        adapter.save_thread.join(5)
        return adapter

    def peer(self, stage_id: int, role: str) -> Any:
        """The connector of the stage on the edge's other side, as its worker builds it."""
        spec = resolve_connector_spec(
            ConnectorSpec(name=self.name, extra=self.extra()), stage_id=stage_id, role=role
        )
        connector = OmniConnectorFactory.create_connector(spec)
        self.connectors.append(connector)
        return connector

    def close(self) -> None:
        for adapter in self.adapters:
            adapter.shutdown()
        for connector in self.connectors:
            connector.close()


@pytest.fixture(params=list(EDGES))
def omni_edge(
    request: pytest.FixtureRequest, bootstrap: str, new_topic: Callable[[], str]
) -> Iterator[Edge]:
    built = Edge(request.param, bootstrap, new_topic() if request.param != SHM else "")
    try:
        yield built
    finally:
        built.close()


def _send(peer: Any, stage_id: int, ext: str, chunk: int, payload: Any) -> None:
    """What the upstream stage's adapter puts for chunk `chunk` of `ext` (its key)."""
    key = f"{ext}_{stage_id - 1}_{chunk}"
    ok, _size, metadata = peer.put(str(stage_id - 1), str(stage_id), key, payload)
    assert ok, _health(peer)
    if isinstance(peer, CodeclogKafkaConnector):
        # the record each edge carries the payload on (the codec edge's are what `codeclog
        # vocode`, `capture` and `replay` read)
        audio = isinstance(payload.get("codes"), dict) and "audio" in payload["codes"]
        record = ("codec_chunk" if audio else "control_event") if peer.codec_edge else None
        assert metadata["record"] == (record or "payload_envelope"), metadata


def _poll(adapter: OmniChunkTransferAdapter, request: Any) -> bool:
    """The adapter's receive loop on one request until its connector handed a chunk out."""
    rid = request.request_id
    adapter.load_async(request)
    entry = adapter._registered_load_entries[rid]
    before = adapter.get_req_chunk[rid]
    deadline = time.monotonic() + WAIT_S
    while True:
        done = bool(adapter._poll_single_request(entry))
        if done or adapter.get_req_chunk[rid] != before:
            return done
        assert time.monotonic() < deadline, f"nothing for {rid}: {_health(adapter.connector)}"
        time.sleep(0.005)


def _receive(peer: Any, from_stage: int, key: str) -> Any:
    """What the downstream stage's connector gets for `key`."""
    deadline = time.monotonic() + WAIT_S
    while (got := peer.get(str(from_stage), str(from_stage + 1), key)) is None:
        assert time.monotonic() < deadline, f"nothing for {key}: {_health(peer)}"
        time.sleep(0.005)
    return got[0]


def _health(connector: Any) -> Any:
    return connector.health() if isinstance(connector, CodeclogKafkaConnector) else connector


def _committed(adapter: OmniChunkTransferAdapter, request: Any) -> Any:
    """What the adapter handed its scheduler for the request's last chunk."""
    if adapter.model_mode == "ar":
        return adapter._pending_ar_prompt_updates[request.request_id][1]
    return {"prompt": list(request.prompt_token_ids), "info": request.additional_information}


# the payload each connector's adapter committed, per case: equal across connectors
_BASELINE: dict[str, Any] = {}


def _same_as_shared_memory(omni_edge: Edge, case: str, committed: Any) -> None:
    if omni_edge.name == SHM:
        _BASELINE[case] = committed
    elif case in _BASELINE:
        assert _same(committed, _BASELINE[case]), (committed, _BASELINE[case])


# ---------------------------------------------------------------------- receive (connector.get)


def test_load_poll(omni_edge: Edge) -> None:
    """upstream: test_load_poll (stage 2, "ar": a terminal payload)."""
    adapter = omni_edge.adapter(stage_id=2, model_mode="ar")
    peer = omni_edge.peer(1, "sender")
    ext = omni_edge.ext("external-1")
    request = _req("req-1", RequestStatus.WAITING, ext)
    payload = {
        "codes": {"audio": [[1]]},
        "hidden_states": {"output": torch.tensor([[2.0]])},
        "meta": {"finished": torch.tensor(True, dtype=torch.bool)},
    }
    _send(peer, 2, ext, 0, payload)
    assert _poll(adapter, request)
    committed = _committed(adapter, request)
    expected = {**payload, "meta": {**payload["meta"], "streaming_prompt_recompute": False}}
    assert _same(committed, expected), committed
    assert adapter.get_req_chunk["req-1"] == 1
    assert "req-1" in adapter._finished_load_reqs
    assert "req-1" in adapter.upstream_exhausted_requests
    _same_as_shared_memory(omni_edge, "load_poll", committed)


def test_load_poll_generation_tensor_codes_use_placeholder_prompt(omni_edge: Edge) -> None:
    """upstream: test_load_poll_generation_tensor_codes_use_placeholder_prompt."""
    adapter = omni_edge.adapter(stage_id=1, model_mode="generation")
    peer = omni_edge.peer(0, "sender")
    ext = omni_edge.ext("external-tensor")
    request = _req("req-tensor", RequestStatus.WAITING, ext)
    codes = torch.tensor([[1, 2], [3, 4]], dtype=torch.long)
    payload = {
        "codes": {"audio": codes},
        "meta": {"left_context_size": 1, "finished": torch.tensor(False, dtype=torch.bool)},
    }
    _send(peer, 1, ext, 0, payload)
    assert _poll(adapter, request)
    assert request.prompt_token_ids == [0]
    assert request.num_computed_tokens == 0
    assert _same(request.additional_information["codes"]["audio"], codes)
    assert request.additional_information["meta"]["left_context_size"] == 1
    assert "finished" not in request.additional_information["meta"]
    assert "req-tensor" in adapter._finished_load_reqs
    _same_as_shared_memory(omni_edge, "tensor_codes", _committed(adapter, request))


def test_load_poll_generation_empty_nonterminal_chunk_keeps_polling(omni_edge: Edge) -> None:
    """upstream: test_load_poll_generation_empty_nonterminal_chunk_keeps_polling (two chunks of
    one request, the first empty: its get is consumed, the request is not ready)."""
    adapter = omni_edge.adapter(stage_id=1, model_mode="generation")
    peer = omni_edge.peer(0, "sender")
    ext = omni_edge.ext("external-empty")
    request = _req("req-empty-tensor", RequestStatus.WAITING, ext)
    meta = {"left_context_size": 0, "finished": torch.tensor(False, dtype=torch.bool)}
    empty = {"codes": {"audio": torch.empty((4, 0), dtype=torch.long)}, "meta": meta}
    ready = {"codes": {"audio": torch.tensor([[1, 2]], dtype=torch.long)}, "meta": meta}
    _send(peer, 1, ext, 0, empty)
    _send(peer, 1, ext, 1, ready)
    assert _poll(adapter, request) is False
    assert request.request_id not in adapter._finished_load_reqs
    assert request.request_id not in adapter.requests_with_ready_chunks
    assert adapter.get_req_chunk[request.request_id] == 1
    assert _poll(adapter, request) is True
    assert request.request_id in adapter._finished_load_reqs
    assert _same(request.additional_information["codes"]["audio"], ready["codes"]["audio"])
    assert adapter.get_req_chunk[request.request_id] == 2


def test_load_poll_non_ar_merges_into_existing_additional_information(omni_edge: Edge) -> None:
    """upstream: test_load_poll_non_ar_merges_into_existing_additional_information."""
    adapter = omni_edge.adapter(stage_id=2, model_mode="diffusion")
    peer = omni_edge.peer(1, "sender")
    ext = omni_edge.ext("ext-non-ar")
    request = _req("req-non-ar", RequestStatus.WAITING, ext)
    request.additional_information = {
        "hidden_states": {"output": torch.tensor([[1.0]])},
        "ids": {"prompt": [11, 12]},
        "meta": {"finished": torch.tensor(False, dtype=torch.bool), "step": 1},
    }
    request.num_computed_tokens = 9
    payload = {
        "hidden_states": {"output": torch.tensor([[2.0]])},
        "ids": {"all": [21, 22]},
        "codes": {"audio": torch.tensor([7, 8], dtype=torch.long)},
        "meta": {"finished": torch.tensor(True, dtype=torch.bool), "phase": "decode"},
        "kv_metadata": {"foo": "bar"},
    }
    _send(peer, 2, ext, 0, payload)
    assert _poll(adapter, request) is True
    info = request.additional_information
    assert request.prompt_token_ids == [7, 8]
    assert request.num_computed_tokens == 0
    assert _same(info["hidden_states"]["output"], torch.tensor([[2.0]]))
    assert info["ids"] == {"prompt": [11, 12], "all": [21, 22]}
    assert info["meta"]["finished"].item() is False  # the merge keeps meta.finished
    assert info["meta"]["phase"] == "decode"
    assert info["kv_metadata"] == {"foo": "bar"}
    assert "req-non-ar" in adapter._finished_load_reqs
    assert "req-non-ar" in adapter.upstream_exhausted_requests
    _same_as_shared_memory(omni_edge, "non_ar_merge", _committed(adapter, request))


def test_load_poll_generation_segment_marker_replaces_previous_chunk(omni_edge: Edge) -> None:
    """upstream: test_load_poll_generation_segment_marker_replaces_previous_chunk."""
    adapter = omni_edge.adapter(stage_id=2, model_mode="generation")
    peer = omni_edge.peer(1, "sender")
    ext = omni_edge.ext("external-marker")
    request = _req("req-marker", RequestStatus.WAITING, ext)
    request.additional_information = {
        "codes": {"audio": torch.tensor([1, 2])},
        "meta": {"cache_epoch": 0, "chunk_seq": 2, "last_chunk": True},
    }
    payload = {
        "codes": {
            "audio": torch.tensor([7, 8], dtype=torch.long),
            "ref": torch.tensor([0.1, -0.1]),
        },
        "meta": {
            "finished": torch.tensor(False, dtype=torch.bool),
            "is_segment_finished": torch.tensor(True, dtype=torch.bool),
            "request_finished": torch.tensor(False, dtype=torch.bool),
            "replace_runtime_additional_information": True,
        },
    }
    _send(peer, 2, ext, 0, payload)
    assert _poll(adapter, request) is True
    info = request.additional_information
    assert request.prompt_token_ids == [7, 8]
    assert "audio" not in info["codes"]
    assert _same(info["codes"]["ref"], torch.tensor([0.1, -0.1]))
    assert not {"cache_epoch", "chunk_seq", "last_chunk"}.intersection(info["meta"])
    assert request.request_id in adapter.segment_finished_requests
    _same_as_shared_memory(omni_edge, "segment_marker", _committed(adapter, request))


def test_load_poll_generation_empty_replacement_snapshot_is_ready(omni_edge: Edge) -> None:
    """upstream: test_load_poll_generation_empty_replacement_snapshot_is_ready."""
    adapter = omni_edge.adapter(stage_id=2, model_mode="generation")
    peer = omni_edge.peer(1, "sender")
    ext = omni_edge.ext("external-empty-marker")
    request = _req("req-empty-marker", RequestStatus.WAITING, ext)
    request.additional_information = {
        "codes": {"audio": torch.tensor([1, 2])},
        "meta": {"cache_epoch": 0, "chunk_seq": 2, "last_chunk": True},
    }
    payload = {
        "meta": {
            "is_segment_finished": torch.tensor(True, dtype=torch.bool),
            "replace_runtime_additional_information": True,
        }
    }
    _send(peer, 2, ext, 0, payload)
    assert _poll(adapter, request) is True
    assert request.prompt_token_ids == [0]
    assert "codes" not in request.additional_information
    assert request.additional_information["meta"]["replace_runtime_additional_information"] is True
    assert request.request_id in adapter.segment_finished_requests
    assert request.request_id in adapter._finished_load_reqs


def test_load_poll_generation_without_snapshot_marker_keeps_incremental_state(
    omni_edge: Edge,
) -> None:
    """upstream: test_load_poll_generation_without_snapshot_marker_keeps_incremental_state."""
    adapter = omni_edge.adapter(stage_id=2, model_mode="generation")
    peer = omni_edge.peer(1, "sender")
    ext = omni_edge.ext("external-incremental")
    request = _req("req-incremental", RequestStatus.WAITING, ext)
    request.additional_information = {
        "codes": {"audio": torch.tensor([1, 2])},
        "meta": {"cache_epoch": 3, "chunk_seq": 2},
    }
    payload = {"meta": {"finished": torch.tensor(False, dtype=torch.bool), "phase": "decode"}}
    _send(peer, 2, ext, 0, payload)
    assert _poll(adapter, request) is False
    info = request.additional_information
    assert _same(info["codes"]["audio"], torch.tensor([1, 2]))
    assert info["meta"]["cache_epoch"] == 3
    assert info["meta"]["chunk_seq"] == 2
    assert info["meta"]["phase"] == "decode"


def test_load_poll_ar_request_additional_information_concats_tensors(omni_edge: Edge) -> None:
    """upstream: test_load_poll_ar_request_additional_information_concats_tensors ("ar" forwards
    the latest payload as it is)."""
    adapter = omni_edge.adapter(stage_id=2, model_mode="ar")
    peer = omni_edge.peer(1, "sender")
    ext = omni_edge.ext("ext-merged")
    request = _req("req-merged", RequestStatus.WAITING, ext)
    request.additional_information = {
        "hidden_states": {"output": torch.tensor([[1.0]])},
        "ids": {"prompt": [11, 12]},
        "meta": {"finished": torch.tensor(False, dtype=torch.bool)},
    }
    payload = {
        "hidden_states": {"output": torch.tensor([[2.0]])},
        "meta": {"finished": torch.tensor(True, dtype=torch.bool)},
    }
    _send(peer, 2, ext, 0, payload)
    assert _poll(adapter, request)
    committed = _committed(adapter, request)
    assert _same(committed["hidden_states"], payload["hidden_states"])
    assert committed["meta"]["finished"].item() is True


def test_cleanup_after_poll_flow(omni_edge: Edge) -> None:
    """upstream: test_cleanup_after_poll_flow (load_async -> poll -> finished -> cleanup)."""
    adapter = omni_edge.adapter(stage_id=2, model_mode="ar")
    peer = omni_edge.peer(1, "sender")
    ext = omni_edge.ext("ext-flow")
    request = _req("req-flow", RequestStatus.WAITING, ext)
    payload = {
        "hidden_states": {"output": torch.tensor([[1.0]])},
        "meta": {"finished": torch.tensor(True, dtype=torch.bool)},
    }
    _send(peer, 2, ext, 0, payload)
    assert _poll(adapter, request)
    assert "req-flow" in adapter.upstream_exhausted_requests
    assert adapter.get_req_chunk["req-flow"] == 1
    assert adapter.request_ids_mapping["req-flow"] == ext
    adapter.cleanup("req-flow", ext)
    assert "req-flow" not in adapter.upstream_exhausted_requests
    assert "req-flow" not in adapter.get_req_chunk
    assert "req-flow" not in adapter.request_ids_mapping
    assert ext not in adapter.request_payload


# ------------------------------------------------------------------------- send (connector.put)


def _spy_puts(adapter: OmniChunkTransferAdapter) -> list[dict[str, Any]]:
    """Upstream reads `connector.put.call_args`; here the real put runs and is recorded."""
    calls: list[dict[str, Any]] = []
    real = adapter.connector.put

    def put(**kwargs: Any) -> Any:
        result = real(**kwargs)
        calls.append({**kwargs, "result": result})
        return result

    adapter.connector.put = put
    return calls


def _task(request: Any, *, finished: bool = False, segment: bool = False) -> dict[str, Any]:
    return {
        "multimodal_output": None,
        "request": request,
        "is_finished": finished,
        "is_segment_finished": segment,
    }


def _on_the_wire(omni_edge: Edge, call: dict[str, Any]) -> Any:
    """The put was acknowledged and the next stage gets it as msgspec's dict of the struct."""
    assert call["result"][0] is True, call["result"]
    peer = omni_edge.peer(int(call["to_stage"]), "receiver")
    got = _receive(peer, int(call["from_stage"]), call["put_key"])
    assert _same(got, to_dict(call["data"])), (got, to_dict(call["data"]))
    return got


def test_send_single_request_terminal_chunk_still_flushes_processor(
    omni_edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upstream: test_send_single_request_terminal_chunk_still_flushes_processor."""
    adapter = omni_edge.adapter(stage_id=0)
    calls = _spy_puts(adapter)
    request = _req("req-terminal", RequestStatus.FINISHED_STOPPED, omni_edge.ext("ext-terminal"))
    flushes: list[bool] = []

    def processor(**kwargs: Any) -> OmniPayloadStruct:
        flushes.append(kwargs["is_finished"])
        return OmniPayloadStruct(codes=CodesStruct(audio=torch.tensor([1, 2, 3], dtype=torch.long)))

    adapter.custom_process_next_stage_input_func = processor
    monkeypatch.setattr(adapter, "cleanup", lambda *a, **kw: None)
    adapter._send_single_request(_task(request, finished=True))
    assert flushes == [True]
    sent = calls[-1]["data"]
    assert bool(sent.meta.finished.item()) is True
    assert bool(sent.meta.is_segment_finished.item()) is False
    got = _on_the_wire(omni_edge, calls[-1])
    assert bool(got["meta"]["finished"].item()) is True


def test_send_single_request_struct_without_meta_does_not_crash(
    omni_edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upstream: test_send_single_request_struct_without_meta_does_not_crash."""
    adapter = omni_edge.adapter(stage_id=1)
    calls = _spy_puts(adapter)
    request = _req("req-no-meta", RequestStatus.WAITING, omni_edge.ext("ext-no-meta"))
    adapter.custom_process_next_stage_input_func = lambda **kwargs: OmniPayloadStruct(
        codes=CodesStruct(audio=torch.tensor([1, 2], dtype=torch.long)),
    )
    cleanups: list[Any] = []
    monkeypatch.setattr(adapter, "cleanup", lambda *a, **kw: cleanups.append((a, kw)))
    adapter._send_single_request(_task(request))
    assert cleanups == []  # no terminal cleanup: meta.finished is false
    _on_the_wire(omni_edge, calls[-1])


def test_send_single_request_empty_struct_goes_on_wire(
    omni_edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upstream: test_send_single_request_empty_struct_goes_on_wire."""
    adapter = omni_edge.adapter(stage_id=1)
    calls = _spy_puts(adapter)
    request = _req("req-empty", RequestStatus.WAITING, omni_edge.ext("ext-empty"))
    adapter.custom_process_next_stage_input_func = lambda **kwargs: OmniPayloadStruct()
    monkeypatch.setattr(adapter, "cleanup", lambda *a, **kw: None)
    adapter._send_single_request(_task(request))
    assert calls
    sent = calls[-1]["data"]
    assert isinstance(sent, OmniPayloadStruct)
    assert sent.meta.finished.item() is False
    assert sent.meta.is_segment_finished.item() is False
    got = _on_the_wire(omni_edge, calls[-1])
    assert got["meta"]["finished"].item() is False


def test_send_single_request_struct_preserves_segment_finished(
    omni_edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upstream: test_send_single_request_struct_preserves_segment_finished."""
    adapter = omni_edge.adapter(stage_id=1)
    calls = _spy_puts(adapter)
    request = _req("req-segment", RequestStatus.WAITING, omni_edge.ext("ext-segment"))
    adapter.custom_process_next_stage_input_func = lambda **kwargs: OmniPayloadStruct()
    monkeypatch.setattr(adapter, "cleanup", lambda *a, **kw: None)
    adapter._send_single_request(_task(request, segment=True))
    sent = calls[-1]["data"]
    assert sent.meta.finished.item() is False
    assert sent.meta.is_segment_finished.item() is True
    got = _on_the_wire(omni_edge, calls[-1])
    assert got["meta"]["is_segment_finished"].item() is True


def test_send_single_request_respects_processor_receiver_boundary(
    omni_edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upstream: test_send_single_request_respects_processor_receiver_boundary."""
    adapter = omni_edge.adapter(stage_id=1)
    calls = _spy_puts(adapter)
    request = _req("req-stream", RequestStatus.WAITING, omni_edge.ext("ext-stream"))
    adapter.custom_process_next_stage_input_func = lambda **kwargs: OmniPayloadStruct(
        meta=MetaStruct(is_segment_finished=torch.tensor(False, dtype=torch.bool))
    )
    monkeypatch.setattr(adapter, "cleanup", lambda *a, **kw: None)
    adapter._send_single_request(_task(request, segment=True))
    assert calls[-1]["data"].meta.is_segment_finished.item() is False
    got = _on_the_wire(omni_edge, calls[-1])
    assert got["meta"]["is_segment_finished"].item() is False


def test_send_single_request_cleans_up_after_finished_payload(
    omni_edge: Edge, monkeypatch: pytest.MonkeyPatch
) -> None:
    """upstream: test_send_single_request_cleans_up_after_finished_payload (the cleanup runs
    only after the put succeeded: here, after the broker acknowledged it)."""
    adapter = omni_edge.adapter(stage_id=1)
    calls = _spy_puts(adapter)
    ext = omni_edge.ext("ext-finished")
    request = _req("req-finished", RequestStatus.FINISHED_STOPPED, ext)
    adapter.custom_process_next_stage_input_func = lambda **kwargs: OmniPayloadStruct(
        meta=MetaStruct(finished=torch.tensor(True, dtype=torch.bool))
    )
    cleanups: list[Any] = []
    monkeypatch.setattr(adapter, "cleanup", lambda *a, **kw: cleanups.append((a, kw)))
    adapter._send_single_request(_task(request, finished=True, segment=True))
    assert len(cleanups) == 1
    assert cleanups[0][0][:2] == ("req-finished", ext)
    got = _on_the_wire(omni_edge, calls[-1])
    assert got["meta"]["finished"].item() is True


def test_wire_round_trip_struct_to_dict_contract(omni_edge: Edge) -> None:
    """upstream: test_wire_round_trip_struct_to_dict_contract, through the connector: the
    sender puts a struct, the receiver gets the dict `to_dict` gives of it."""
    sender = omni_edge.peer(1, "sender")
    receiver = omni_edge.peer(2, "receiver")
    struct = OmniPayloadStruct(
        meta=MetaStruct(finished=torch.tensor(True, dtype=torch.bool), left_context_size=12),
        codes=CodesStruct(audio=torch.tensor([1, 2, 3], dtype=torch.int64)),
    )
    key = f"{omni_edge.ext('wire')}_1_0"
    assert sender.put("1", "2", key, struct)[0]
    decoded = _receive(receiver, 1, key)
    assert isinstance(decoded, dict) and isinstance(decoded["meta"], dict)
    assert isinstance(decoded["meta"]["finished"], torch.Tensor)
    assert bool(decoded["meta"]["finished"].item()) is True
    assert decoded["meta"]["left_context_size"] == 12
    assert _same(decoded["codes"]["audio"], torch.tensor([1, 2, 3], dtype=torch.int64))
    expected = to_dict(struct)
    assert decoded.keys() == expected.keys()
    assert decoded["meta"].keys() == expected["meta"].keys()
    assert decoded["codes"].keys() == expected["codes"].keys()


def test_sender_only_adapter_does_not_park_or_clear_requests(omni_edge: Edge) -> None:
    """upstream: test_sender_only_adapter_does_not_park_or_clear_requests (role "sender")."""
    adapter = omni_edge.adapter(stage_id=1, connector_extra={"role": "sender"})
    request = _req("req-1", RequestStatus.WAITING, omni_edge.ext("req-1"))
    request.additional_information = {"tts_token_ids": torch.tensor([1])}
    waiting = edge._WaitingQueue([request])
    running: list[Any] = []
    adapter.load_async(request)
    adapter.process_pending_chunks(waiting, running, scheduler_requests={"req-1": request})
    assert waiting == [request]
    assert request.status == RequestStatus.WAITING
    assert request.additional_information["tts_token_ids"].item() == 1
    assert not adapter._pending_load_reqs
    if omni_edge.name == KAFKA:
        assert adapter.connector.health()["role"] == "sender"  # no consumer started


# ------------------------------------------------------------ test_basic_connectors.py's cases


@pytest.mark.parametrize(
    "value",
    [
        {"key": "value", "list": [1, 2, 3]},  # test_basic_serialization
        torch.tensor([[1.0, 2.0], [3.0, 4.0]]),  # test_tensor_serialization
        {"codes": torch.arange(40, dtype=torch.long).reshape(4, 10).transpose(0, 1)},
        np.array([[1, 2, 3], [4, 5, 6]]),  # test_ndarray_serialization
    ],
    ids=["basic", "tensor", "noncontiguous_tensor", "ndarray"],
)
def test_serialization_through_put_and_get(omni_edge: Edge, value: Any) -> None:
    """upstream: test_basic_serialization, test_tensor_serialization,
    test_noncontiguous_tensor_serialization, test_ndarray_serialization (OmniSerializer there:
    the connector's serialize_obj / deserialize_obj here, and a put and get across the edge)."""
    sender = omni_edge.peer(1, "sender")
    receiver = omni_edge.peer(2, "receiver")
    assert _same(sender.deserialize_obj(sender.serialize_obj(value)), value)
    key = f"{omni_edge.ext('ser')}_1_0"
    assert sender.put("1", "2", key, value)[0]
    assert _same(_receive(receiver, 1, key), value)


def test_create_connector_through_the_factory(omni_edge: Edge) -> None:
    """upstream: test_create_shm_connector and test_create_unknown_connector (codeclog's
    plugin registered, an unknown name still raises ValueError); test_create_connector_config
    _parsing, with the real factory: the adapter's create_connector builds the named connector
    from a spec object's name and extra, with the stage id."""
    spec = ConnectorSpec(name=omni_edge.name, extra=omni_edge.extra())
    connector = OmniConnectorFactory.create_connector(spec)
    omni_edge.connectors.append(connector)
    kind = CodeclogKafkaConnector if omni_edge.name == KAFKA else SharedMemoryConnector
    assert isinstance(connector, kind)
    with pytest.raises(ValueError):
        OmniConnectorFactory.create_connector(ConnectorSpec(name="UnknownConnector"))
    raw = SimpleNamespace(name=omni_edge.name, extra=omni_edge.extra())
    built = OmniChunkTransferAdapter.create_connector(
        SimpleNamespace(stage_connector_config=raw, stage_id=2)
    )
    omni_edge.connectors.append(built)
    assert isinstance(built, kind)
    assert built.stage_id == 2


@pytest.mark.parametrize("size", [11, 200, 256 * 1024])
def test_put_get_payload(omni_edge: Edge, size: int) -> None:
    """upstream: test_put_get_small_payload_uses_shm and test_put_get_shm (small and large
    payloads; here also 256 KiB): put answers (True, size, metadata), get with that metadata
    answers (data, size) with the same size, once."""
    sender = omni_edge.peer(1, "sender") if omni_edge.name == KAFKA else None
    one = omni_edge.peer(1, "dual")
    data = {"large": "x" * size}
    key = f"{omni_edge.ext('putget')}_1_0"
    ok, put_size, metadata = (sender or one).put("1", "2", key, data)
    assert ok is True and metadata
    if omni_edge.name == KAFKA:
        assert {"topic", "partition", "offset"} <= metadata.keys()
        receiver = omni_edge.peer(2, "receiver")
        deadline = time.monotonic() + WAIT_S
        while (got := receiver.get("1", "2", key, metadata)) is None:
            assert time.monotonic() < deadline, receiver.health()
            time.sleep(0.005)
    else:
        assert "shm" in metadata
        got = one.get("1", "2", key, metadata)
        receiver = one
    assert got is not None
    assert got[0] == data
    assert got[1] == put_size
    assert receiver.get("1", "2", key, metadata) is None  # a key is handed out once


def test_get_invalid_metadata(omni_edge: Edge) -> None:
    """upstream: test_get_invalid_metadata (a key never put, any metadata: None, at once)."""
    receiver = omni_edge.peer(2, "receiver")
    key = f"{omni_edge.ext('nothing')}_1_0"
    started = time.monotonic()
    assert receiver.get("1", "2", key, {}) is None
    assert receiver.get("1", "2", key, {"unknown": "format"}) is None
    assert time.monotonic() - started < 1.0  # get never blocks
