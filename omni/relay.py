"""`AudioRelayClient`: vllm-omni's Code2Wav stage, as its orchestrator sees it, fed by codeclog. It
imports vllm and vllm-omni when built, never at import: codeclog runs without them.
Reasons: docs/vllm-omni.md, "Mode 2 end to end"."""

from __future__ import annotations

import importlib
import logging
import queue
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from codeclog.omni.audio_return import AudioReturn, Event, Failure, ReturnConfig, Window

LOGGER = logging.getLogger("codeclog.omni")
PCM_SCALE = 32768.0  # int16 -> float32 and back, exactly (every int16 / 2**15 is a float32)


class StageClientBase:
    """What vllm-omni's orchestrator reads of an LLM stage's client that no engine backs:
    no prompt transforms, no inputs to process, no KV or payload sender, no RPCs."""

    stage_type = "llm"
    is_comprehension = False
    requires_multimodal_data = False
    prompt_transform_func = None
    prompt_expand_func = None
    custom_process_input_func = None

    async def collective_rpc_async(
        self,
        method: str,
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return {"supported": False, "method": method}

    def set_engine_outputs(self, engine_outputs: Any) -> None:
        return None

    def process_engine_inputs(self, source_outputs: list[Any], prompt: Any = None, **_: Any) -> Any:
        return []

    def get_kv_sender_info(self, **_: Any) -> dict[str, Any] | None:
        return None

    def get_payload_sender_info(self) -> dict[str, Any] | None:
        return None


class AudioRelayClient(StageClientBase):
    """A Code2Wav stage client whose audio comes from codeclog's committed audio
    (omni.audio_return). It sits where the Code2Wav stage's engine client sits (in the stage's
    `StagePool`, in the orchestrator thread of vllm-omni's API server) and speaks the same
    pool-facing protocol (`vllm_omni/engine/stage_client.py`, `StagePoolLLMClient`): the
    orchestrator submits each request's placeholder to it when the request starts
    (`_prewarm_async_chunk_stages`) and polls it for engine outputs. It answers with what the
    Code2Wav engine core would emit: one `OmniEngineCoreOutput` per window, `multimodal_output`
    as `minicpmo_4_5_code2wav.py` builds it (`model_outputs` a 1-D float32 waveform, the
    window's 16-bit PCM / 32768 exactly; `sr` an int32 24000; `meta.duplex_epoch` (the chunk's
    cache epoch), `meta.tts_is_last_chunk` and `meta.segment_end` (`window_output`); no turn
    id), the request's last window with finish reason STOP;
    a failure as finish reason ERROR with the reason as `stop_reason`."""

    def __init__(
        self,
        config: ReturnConfig,
        stage_id: int = 2,
        replica_id: int = 0,
        *,
        engine_input_source: Sequence[int] = (1,),
        default_sampling_params: Any = None,
        model_stage: str | None = "code2wav",
    ) -> None:
        finish = importlib.import_module("vllm.v1.engine").FinishReason
        engine = importlib.import_module("vllm_omni.engine")
        self._output_type = engine.OmniEngineCoreOutput
        self._outputs_type = engine.OmniEngineCoreOutputs
        self._stop, self._error = finish.STOP, finish.ERROR
        self.stage_id = stage_id
        self.replica_id = replica_id
        self.model_stage = model_stage
        self.final_output = True
        self.final_output_type = "audio"
        self.engine_input_source = list(engine_input_source)
        self.default_sampling_params = default_sampling_params
        self._queue: queue.Queue[Any] = queue.Queue()
        self.added: list[str] = []  # request ids submitted, in order (health and tests)
        self.aborted: list[str] = []
        self.audio = AudioReturn(config, self._emit)
        self.audio.start()

    # ---------------------------------------------------------------- what the orchestrator calls
    async def add_request_async(self, request: Any, *args: Any, **kwargs: Any) -> None:
        internal = str(request.request_id)
        external = str(getattr(request, "external_req_id", None) or internal)
        self.audio.register(internal, external)
        self.added.append(internal)

    async def get_output_async(self) -> Any:
        return self._outputs_type(outputs=drained(self._queue), timestamp=time.monotonic())

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.audio.unregister(str(request_id))
            self.aborted.append(str(request_id))

    def check_health(self) -> None:
        if not self.audio.running:
            raise RuntimeError(f"codeclog audio return stopped: {self.audio.error or 'closed'}")

    def shutdown(self) -> None:
        self.audio.close()

    # ------------------------------------------------------------------------------- outputs
    def _emit(self, events: Sequence[Event]) -> None:
        for event in events:
            self._queue.put(self._output(event))

    def _output(self, event: Event) -> Any:
        if isinstance(event, Failure):
            LOGGER.error("%s", event.reason)
            return self._output_type(
                request_id=event.request_id,
                new_token_ids=[],
                finish_reason=self._error,
                stop_reason=event.reason,
            )
        return self._output_type(
            request_id=event.request_id,
            new_token_ids=[0],
            multimodal_output=window_output(event),
            finish_reason=self._stop if event.final else None,
        )


def drained(outputs: queue.Queue[Any]) -> list[Any]:
    """What waits in `outputs`, taken without blocking: one poll's engine outputs."""
    taken = []
    while True:
        try:
            taken.append(outputs.get_nowait())
        except queue.Empty:
            return taken


def window_output(window: Window) -> dict[str, Any]:
    """The `multimodal_output` of one window, as MiniCPM-o's Code2Wav makes it."""
    import torch

    pcm = np.frombuffer(window.pcm, dtype="<i2").astype(np.float32) / PCM_SCALE
    chunk = window.chunk
    return {
        "model_outputs": torch.from_numpy(pcm),
        "sr": torch.tensor(window.sample_rate_hz, dtype=torch.int32),
        "meta.duplex_epoch": torch.tensor(chunk.cache_epoch, dtype=torch.int32),
        "meta.tts_is_last_chunk": torch.tensor(window.final, dtype=torch.bool),
        "meta.segment_end": torch.tensor(window.final, dtype=torch.bool),
    }


def pcm_of(waveform: Any) -> bytes:
    """The 16-bit PCM a relayed waveform came from (its inverse: exact)."""
    values = np.asarray(waveform, dtype=np.float32) * PCM_SCALE
    return np.round(values).astype("<i2").tobytes()
