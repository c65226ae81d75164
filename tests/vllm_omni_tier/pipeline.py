"""The MiniCPM-o talker -> Code2Wav edge of the released vllm-omni, driven as its engine drives it.

Everything here is the real package: the deploy config goes through vllm-omni's own
`load_omni_transfer_config` and `get_stage_connector_spec`; the connector is made by the real
`OmniChunkTransferAdapter` through the real `OmniConnectorFactory` (where vLLM's plugin loading
registered codeclog); the talker side runs the package's `tts2code2wav_async_chunk` processor.
What the package cannot reach here (no GPU, no weights) is plain objects, as upstream's own
adapter tests make them: the vLLM model and scheduler configs, the requests, and `Code2Wav`, the
scheduler loop of the Code2Wav stage as far as the adapter sees it.
"""

from __future__ import annotations

import copy
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch
from vllm.v1.request import RequestStatus
from vllm_omni.core.sched.omni_scheduler_mixin import OmniSchedulerMixin
from vllm_omni.data_entry_keys import OmniPayloadStruct
from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
    OmniChunkTransferAdapter,
)
from vllm_omni.distributed.omni_connectors.utils.initialization import load_omni_transfer_config
from vllm_omni.engine.stage_init_utils import get_stage_connector_spec

PROCESSOR = (
    "vllm_omni.model_executor.stage_input_processors.minicpmo_4_5_omni.tts2code2wav_async_chunk"
)
TALKER, CODE2WAV = 1, 2
# The codec windowing extras of vllm-omni's MiniCPM-o 4.5 deploy (deploy/minicpmo_4_5.yaml),
# which its processor reads from the connector config.
CODEC_EXTRA = {"codec_chunk_frames": 25, "codec_left_context_frames": 3}
SILENCE = 4218


def deploy_config(connector: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """A deploy config shaped like vllm-omni's minicpmo_4_5.yaml, its one edge on `connector`."""
    return {
        "pipeline": "minicpmo_4_5",
        "async_chunk": True,
        "connectors": {"talker_to_code2wav": {"name": connector, "extra": dict(extra)}},
        "stages": [
            {"stage_id": 0, "max_num_seqs": 4},
            {
                "stage_id": TALKER,
                "max_num_seqs": 4,
                "output_connectors": {f"to_stage_{CODE2WAV}": "talker_to_code2wav"},
            },
            {
                "stage_id": CODE2WAV,
                "max_num_seqs": 4,
                "input_connectors": {f"from_stage_{TALKER}": "talker_to_code2wav"},
            },
        ],
    }


def kafka_extra(bootstrap: str, topic: str, **more: Any) -> dict[str, Any]:
    """The edge's extra on `topic`, its receivers in groups of their own (a group's static
    members outlive their process: a test reusing one would wait out its session)."""
    group = {"group_id": f"code2wav-{uuid.uuid4().hex[:8]}"}
    return {"bootstrap": bootstrap, "topic": topic, **CODEC_EXTRA, **group, **more}


def shm_extra() -> dict[str, Any]:
    return {"connector_get_sleep_s": 0.01, **CODEC_EXTRA}


def _adapter(deploy: dict[str, Any], stage_id: int, worker_type: str) -> OmniChunkTransferAdapter:
    transfer = load_omni_transfer_config(config_dict=deploy)
    spec = get_stage_connector_spec(transfer, stage_id, async_chunk=True)
    model_config = SimpleNamespace(
        stage_id=stage_id,
        stage_connector_config=spec,
        worker_type=worker_type,
        async_chunk=True,
        max_num_seqs=4,
        max_model_len=4096,
        custom_process_next_stage_input_func=PROCESSOR if stage_id == TALKER else None,
    )
    scheduler_config = SimpleNamespace(max_num_seqs=4)
    return OmniChunkTransferAdapter(
        SimpleNamespace(model_config=model_config, scheduler_config=scheduler_config)
    )


def talker_adapter(deploy: dict[str, Any]) -> OmniChunkTransferAdapter:
    """The talker stage's adapter (stage 1, worker type "ar"): the sending side of the edge."""
    return _adapter(deploy, TALKER, "ar")


def code2wav_adapter(deploy: dict[str, Any], replica: int = 0) -> OmniChunkTransferAdapter:
    """The Code2Wav stage's adapter (stage 2, "generation"), in replica `replica`: vllm-omni
    sets VLLM_OMNI_REPLICA_ID in each stage engine process before its adapter is built."""
    with replica_env(replica):
        return _adapter(deploy, CODE2WAV, "generation")


@contextmanager
def replica_env(replica: int) -> Iterator[None]:
    before = os.environ.get("VLLM_OMNI_REPLICA_ID")
    os.environ["VLLM_OMNI_REPLICA_ID"] = str(replica)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_OMNI_REPLICA_ID", None)
        else:
            os.environ["VLLM_OMNI_REPLICA_ID"] = before


class Request(SimpleNamespace):
    """A vLLM request as the adapter and the processor read it (the adapter snapshots it with
    copy.copy for its save thread, so `is_finished` reads the snapshot's own status)."""

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)


def request(request_id: str, external_id: str, **more: Any) -> Request:
    fields: dict[str, Any] = {
        "status": RequestStatus.WAITING,
        "resumable": False,
        "segment": 0,
        "prompt_token_ids": [],
        "num_computed_tokens": 0,
        "num_output_placeholders": 0,
        "additional_information": None,
        **more,
    }
    return Request(request_id=request_id, external_req_id=external_id, **fields)


def talk(
    adapter: OmniChunkTransferAdapter,
    streams: Mapping[str, list[int]],
    *,
    abort: tuple[str, ...] = (),
    unfinished: tuple[str, ...] = (),
    turns: Mapping[str, list[int]] | None = None,
    pace_s: float = 0.0,
    on_step: Callable[[int], None] | None = None,
) -> None:
    """The talker's engine loop: one codec id per request per step, interleaved, then the EOS
    step (the request finished, or aborted for those in `abort`; none for those in `unfinished`,
    as from a talker that stopped), each step through save_async;
    `turns`: a resumable request's (vllm-omni's /v1/realtime sessions) segment lengths, all but
    its last: each segment under a new internal request of the same external id, ended by a
    segment finish (its own step), so the processor opens a new cache epoch for each;
    `pace_s` between steps (a talker generating in real time, not all at once), `on_step`
    called with the number of steps done after each."""
    cuts = {rid: (turns or {}).get(rid, []) for rid in streams}
    scripts = {rid: _script(ids, cuts[rid]) for rid, ids in streams.items()}
    requests = {rid: request(f"talker-{rid}", rid) for rid in streams}
    for step in range(max(len(script) for script in scripts.values())):
        if pace_s:
            time.sleep(pace_s)
        for rid, script in scripts.items():
            if step >= len(script) or (step == len(script) - 1 and rid in unfinished):
                continue
            segment, event = script[step]
            req = requests[rid]
            if req.segment != segment:  # the session's next turn: a new internal request
                req = requests[rid] = request(f"talker-{rid}-{segment}", rid)
            req.segment, req.resumable = segment, segment < len(cuts[rid])
            if event == "end":
                aborted = rid in abort
                req.status = (
                    RequestStatus.FINISHED_ABORTED if aborted else RequestStatus.FINISHED_STOPPED
                )
            req.num_computed_tokens += 1
            delta = [event] if isinstance(event, int) else []
            output = {"codes.audio": torch.tensor(delta, dtype=torch.long)}
            adapter.save_async(
                multimodal_output=output, request=req, is_segment_finished=event == "segment"
            )
        if on_step is not None:
            on_step(step + 1)


def _script(ids: list[int], cuts: list[int]) -> list[tuple[int, int | str]]:
    """A request's talker steps: (its segment, a codec id | "segment" | "end")."""
    script: list[tuple[int, int | str]] = []
    start = 0
    for segment, length in enumerate([*cuts, len(ids) - sum(cuts)]):
        script += [(segment, code) for code in ids[start : start + length]]
        script.append((segment, "segment" if segment < len(cuts) else "end"))
        start += length
    return script


def talk_segments(
    adapter: OmniChunkTransferAdapter, external_id: str, segments: list[list[int]]
) -> None:
    """A resumable request of `segments` (`talk`'s `turns`), alone."""
    ids = [code for segment in segments for code in segment]
    talk(adapter, {external_id: ids}, turns={external_id: [len(s) for s in segments[:-1]]})


def wait_sent(adapter: OmniChunkTransferAdapter, timeout_s: float = 60.0) -> None:
    """Until the adapter's save thread has put everything queued."""
    deadline = time.monotonic() + timeout_s
    while adapter._pending_save_reqs or any(t.in_flight for t in adapter._sender_tokens.values()):
        if time.monotonic() > deadline:
            raise AssertionError("the talker adapter did not send everything in time")
        time.sleep(0.01)


class _WaitingQueue(list):  # vLLM's request queue, as far as the adapter uses it
    def prepend_requests(self, requests: list[Any]) -> None:
        self[:0] = list(requests)

    def add_request(self, request: Any) -> None:
        self.append(request)


class Code2Wav:
    """The Code2Wav stage's scheduler loop as the chunk adapter sees it.

    Each step: `process_pending_chunks` parks the requests that need a chunk (registering their
    next get) and hands back those whose chunk arrived; the scheduler's own
    `_process_chunk_receive_failures` (vllm-omni's OmniSchedulerMixin) ends the requests the
    adapter recorded a receive failure for as FINISHED_ERROR; each request with a chunk runs one
    step on it (recorded: prompt token ids and the payload's `meta`), its ready mark cleared
    through `postprocess_scheduler_output`; a request whose input is exhausted finishes through
    `finish_requests`; `restore_queues` returns the parked ones.
    """

    def __init__(self, adapter: OmniChunkTransferAdapter) -> None:
        self.adapter = adapter
        self.chunk_transfer_adapter = adapter  # what the scheduler mixin reads
        self.waiting = _WaitingQueue()
        self.running: list[Any] = []
        self.requests: dict[str, Any] = {}
        self.chunks: dict[str, list[dict[str, Any]]] = {}  # external id -> what each step got
        self.finished: list[str] = []
        self.failed: list[str] = []  # external ids ended as FINISHED_ERROR
        self.segment_ends: dict[str, int] = {}  # external id -> segments ended

    def add(self, external_id: str) -> None:
        """Admit a request; one admitted already (a session's next turn, submitted again by
        the orchestrator's prewarm) goes on as it was."""
        req = request(f"code2wav-{external_id}", external_id)
        if req.request_id in self.requests:
            return
        self.requests[req.request_id] = req
        self.chunks[external_id] = []
        self.segment_ends[external_id] = 0
        self.waiting.add_request(req)

    def step(self) -> None:
        adapter = self.adapter
        adapter.process_pending_chunks(self.waiting, self.running, scheduler_requests=self.requests)
        OmniSchedulerMixin._process_chunk_receive_failures(self)  # type: ignore[arg-type]
        scheduled = []
        for req in list(self.waiting):
            if req.request_id in adapter.requests_with_ready_chunks:
                scheduled.append(req)
                self.chunks[req.external_req_id].append(_seen(req))
            elif req.request_id in adapter.upstream_exhausted_requests:
                self._finish(req)
            elif adapter.is_done_receiving_chunks(req.request_id):  # a segment's end
                self._end_segment(req)
        output = SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=r.request_id) for r in scheduled],
            scheduled_cached_reqs=SimpleNamespace(req_ids=[], additional_information={}),
        )
        adapter.postprocess_scheduler_output(output, self.requests)
        adapter.restore_queues(self.waiting, self.running, self.requests)

    def _end_segment(self, req: Any) -> None:
        """A resumable request's segment ended: its receiver goes on to the next, as vllm-omni's
        duplex scheduler resumes it without an update (`_resume_downstream_chunk_receiver`)."""
        self.adapter.segment_finished_requests.discard(req.request_id)
        self.segment_ends[req.external_req_id] += 1

    def _finish(self, req: Any) -> None:
        self.finish_requests({req.request_id}, RequestStatus.FINISHED_STOPPED)

    def finish_requests(self, request_ids: Any, status: RequestStatus) -> None:
        """vLLM's Scheduler.finish_requests, as far as the adapter takes part in it."""
        for request_id in sorted(request_ids):
            req = self.requests.get(request_id)
            if req is None:
                continue
            if req in self.waiting:
                self.waiting.remove(req)
            req.status = status
            self.adapter.finish_requests({request_id}, status, self.requests)
            del self.requests[request_id]
            ended = self.failed if status == RequestStatus.FINISHED_ERROR else self.finished
            ended.append(req.external_req_id)

    def run(self, timeout_s: float = 120.0) -> None:
        """Step until every request added has finished."""
        deadline = time.monotonic() + timeout_s
        while self.requests:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"Code2Wav requests still waiting: {sorted(self.requests)}; "
                    f"connector: {self.adapter.connector.health()}"
                )
            self.step()
            time.sleep(0.002)


def _seen(req: Any) -> dict[str, Any]:
    """What one Code2Wav step of a request got from the adapter."""
    info = req.additional_information or {}
    meta = info.get("meta", {}) if isinstance(info, Mapping) else {}
    return {
        "prompt_token_ids": list(req.prompt_token_ids),
        "meta": {k: _value(v) for k, v in meta.items()},
    }


def _value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    return copy.deepcopy(value)


def unique_streams(lengths: Mapping[str, int]) -> dict[str, list[int]]:
    """Codec ids per request before EOS, under request ids unique to this run."""
    run = uuid.uuid4().hex[:8]
    return {
        f"{name}-{run}": [(n * 37 + i) % 6561 for i in range(count)]
        for n, (name, count) in enumerate(lengths.items())
    }


def run_edge(
    deploy: dict[str, Any],
    streams: Mapping[str, list[int]],
    abort: tuple[str, ...] = (),
    turns: Mapping[str, list[int]] | None = None,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Talker and Code2Wav adapters on one deploy config: what each Code2Wav request got, and
    the receiving connector's health."""
    talker = talker_adapter(deploy)
    code2wav = Code2Wav(code2wav_adapter(deploy))
    try:
        for rid in streams:
            code2wav.add(rid)
        talk(talker, streams, abort=abort, turns=turns)
        wait_sent(talker)
        code2wav.run()
        health = code2wav.adapter.connector.health()
        return code2wav.chunks, health
    finally:
        talker.shutdown()
        code2wav.adapter.shutdown()


def admitting_chunk_stripped(processor: Any, epoch: int = 1) -> Any:
    """The processor, with the admitting chunk of `epoch` (chunk_seq 0) stripped to its codes
    and request id: what vllm-omni's runner left of it when async-chunk pre-warm state shadowed
    it (the seed incident, vllm-omni #7978/#7979), so the log holds what Code2Wav then read."""

    def stripped(
        transfer_manager: Any, multimodal_output: Any, request: Any, is_finished: bool = False
    ) -> OmniPayloadStruct | None:
        payload = processor(
            transfer_manager=transfer_manager,
            multimodal_output=multimodal_output,
            request=request,
            is_finished=is_finished,
        )
        meta = payload.meta if payload is not None else None
        if meta is not None and meta.cache_epoch == epoch and meta.chunk_seq == 0:
            return OmniPayloadStruct(codes=payload.codes, request_id=payload.request_id)
        return payload

    return stripped
