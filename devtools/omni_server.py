"""vllm-omni's orchestrator, in process, as its API server runs it, for the real-package tier and
`bench.bench_return_path`. What is real and what is not: docs/testing.md, "Inside the released
vllm-omni"."""

from __future__ import annotations

import asyncio
import importlib
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from codeclog.omni.relay import StageClientBase, drained


def _import(name: str) -> Any:
    return importlib.import_module(name)


THINKER, TALKER, CODE2WAV = 0, 1, 2


class EchoStage(StageClientBase):
    """An LLM stage's engine client that finishes a request when `finish` is called."""

    def __init__(self, stage_id: int, final_output: bool, final_output_type: str | None) -> None:
        self.stage_id = stage_id
        self.replica_id = 0
        self.model_stage = ("thinker", "talker")[stage_id]
        self.final_output = final_output
        self.final_output_type = final_output_type
        self.engine_input_source = [stage_id - 1] if stage_id else []
        self.default_sampling_params = _import("vllm.sampling_params").SamplingParams(max_tokens=1)
        self.added: list[str] = []
        self._queue: queue.Queue[Any] = queue.Queue()

    async def add_request_async(self, request: Any, *args: Any, **kwargs: Any) -> None:
        self.added.append(request.request_id)

    async def get_output_async(self) -> Any:
        engine = _import("vllm_omni.engine")
        return engine.OmniEngineCoreOutputs(
            outputs=drained(self._queue), timestamp=time.monotonic()
        )

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        return None

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def finish(self, request_id: str) -> None:
        engine, finish = _import("vllm_omni.engine"), _import("vllm.v1.engine").FinishReason
        output = engine.OmniEngineCoreOutput(
            request_id=request_id, new_token_ids=[0], finish_reason=finish.STOP
        )
        self._queue.put(output)


def _stage_config(max_len: int, connector: Mapping[str, Any] | None = None) -> SimpleNamespace:
    """What the orchestrator reads of a stage's vLLM config (no model is loaded); `connector`:
    its input edge's connector (`name`, `extra`), as vllm-omni's engine args build it."""
    model = SimpleNamespace(
        max_model_len=max_len,
        async_chunk=True,
        stage_connector_config=dict(connector) if connector else None,
        hf_config=None,
    )
    return SimpleNamespace(model_config=model)


class OmniServer:
    """The orchestrator of a MiniCPM-o-shaped pipeline (thinker, talker, Code2Wav) whose
    Code2Wav replicas' clients are `code2wav` (one client, or a list); `connector`: the
    talker -> Code2Wav edge's connector config. `submit` a request, `read` what comes out."""

    def __init__(self, code2wav: Any, connector: Mapping[str, Any] | None = None) -> None:
        self.thinker = EchoStage(THINKER, True, "text")
        self.talker = EchoStage(TALKER, False, None)
        replicas = list(code2wav) if isinstance(code2wav, (list, tuple)) else [code2wav]
        self.code2wav = replicas[0]
        self.replicas = replicas
        stages = (
            ("text", [self.thinker], None),
            ("latent", [self.talker], None),
            ("audio", replicas, connector),
        )
        pool = _import("vllm_omni.engine.stage_pool").StagePool
        processor = _import("vllm_omni.outputs.output_processor").MultimodalOutputProcessor
        self.pools = [
            pool(
                stage,
                clients,
                output_processor=processor(None, log_stats=False, engine_core_output_type=kind),
                stage_vllm_config=_stage_config(65536, edge),
            )
            for stage, (kind, clients, edge) in enumerate(stages)
        ]
        self._ready = threading.Event()
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._serve, name="orchestrator", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the orchestrator did not start")
        self.messages: list[Any] = []

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def main() -> None:
            janus = _import("janus")
            requests, outputs, rpc = janus.Queue(), janus.Queue(), janus.Queue()
            self._box.update(requests=requests, outputs=outputs)
            orchestrator = _import("vllm_omni.engine.orchestrator").Orchestrator(
                request_async_queue=requests.async_q,
                output_async_queue=outputs.async_q,
                rpc_async_queue=rpc.async_q,
                stage_pools=self.pools,
                async_chunk=True,
            )
            self._ready.set()
            await orchestrator.run()

        loop.run_until_complete(main())

    def submit(self, request_id: str, *, resumable: bool = False) -> None:
        """A chat request asking for audio, streamed (DELTA), as the API server submits it;
        `resumable`: a streaming session's first turn (its later turns: `update`)."""
        self._box["requests"].sync_q.put(self._message("add_request", request_id, resumable))

    def update(self, request_id: str) -> None:
        """A streaming session's next turn, as `AsyncOmni` submits it (`streaming_update`)."""
        self._box["requests"].sync_q.put(self._message("streaming_update", request_id, True))

    def _message(self, kind: str, request_id: str, resumable: bool) -> Any:
        params = _import("vllm.sampling_params")
        sampling, output_kind = params.SamplingParams, params.RequestOutputKind
        thinker = sampling(max_tokens=8, output_kind=output_kind.FINAL_ONLY)
        talker = sampling(max_tokens=4096, output_kind=output_kind.DELTA)
        code2wav = sampling(max_tokens=65536, output_kind=output_kind.DELTA)
        prompt = {"prompt_token_ids": [1, 2, 3]}
        orchestrator = _import("vllm_omni.engine.orchestrator")
        first = orchestrator.build_engine_core_request_from_tokens(
            request_id, prompt, thinker, resumable=resumable
        )
        first.external_req_id = request_id
        messages = _import("vllm_omni.engine.messages")
        return messages.StageSubmissionMessage(
            type=kind,
            request_id=request_id,
            prompt=first,
            original_prompt=prompt,
            output_prompt_text=None,
            sampling_params_list=[thinker, talker, code2wav],
            final_stage_id=CODE2WAV,
            preprocess_ms=0.0,
            request_timestamp=time.time(),
            enqueue_ts=time.perf_counter(),
        )

    def finish_upstream(self, request_id: str) -> None:
        """The thinker and the talker are done with the request (their engines' last output)."""
        self.thinker.finish(request_id)
        self.talker.finish(request_id)

    def read(self, timeout_s: float) -> list[Any]:
        """The orchestrator's output messages that came within `timeout_s`."""
        return [message for _at, message in self.read_timed(timeout_s)]

    def read_timed(self, timeout_s: float) -> list[tuple[float, Any]]:
        """As `read`, each with the wall clock (Unix s) at which it was taken off the queue."""
        got: list[tuple[float, Any]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                message = self._box["outputs"].sync_q.get(timeout=0.05)
            except queue.Empty:
                if got:
                    break
                continue
            got.append((time.time(), message))
        self.messages += [message for _at, message in got]
        return got

    def close(self) -> None:
        shutdown = _import("vllm_omni.engine.messages").ShutdownRequestMessage
        self._box["requests"].sync_q.put(shutdown())
        self._thread.join(30)
        for replica in self.replicas:
            replica.shutdown()


def is_error(message: Any) -> bool:
    return type(message).__name__ == "ErrorMessage"


def is_audio(message: Any) -> bool:
    """An output message of the audio stage."""
    return type(message).__name__ == "OutputMessage" and message.stage_id == CODE2WAV


def audio_of(message: Any) -> tuple[Sequence[Any], bool, int | None]:
    """What a client of vllm-omni's API gets from one output message of the audio stage:
    its waveforms (one per window, as streamed), whether the request finished, the rate."""
    omni_output = _import("vllm_omni.outputs").OmniRequestOutput
    output = omni_output.from_stage_output(
        message.engine_outputs,
        request_id=message.request_id,
        finished=message.finished,
        stage_id=message.stage_id,
        final_output_type="audio",
    )
    payload = output.multimodal_output
    audio = payload.get("audio")
    windows = audio if isinstance(audio, list) else ([] if audio is None else [audio])
    rate = payload.get("sr")
    return windows, bool(message.finished), int(rate) if rate is not None else None
