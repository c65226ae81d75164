"""A Code2Wav replica in a process of its own, behind vllm-omni's orchestrator: the stage client
the orchestrator polls (as vLLM's engine core client for a stage engine process), over the
replica process of stage_procs.py (the real chunk adapter and connector, the Code2Wav
scheduler loop as the adapter sees it).

Each Code2Wav step of a request becomes one engine output whose waveform is the codes the step
got (as floats: the orchestrator's audio output then carries them); a resumable request's
segment end, a STOP marked `is_segment_finished`; a request's end, its finish (STOP) or
failure (ERROR, the reason as stop_reason). When the process is gone, the
client raises vLLM's `EngineDeadError`, as the engine core client of a dead engine does, and
the orchestrator handles the dead replica.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from vllm.v1.engine import FinishReason
from vllm.v1.engine.exceptions import EngineDeadError
from vllm_omni.engine import OmniEngineCoreOutput, OmniEngineCoreOutputs

from codeclog.omni.relay import StageClientBase, drained

HERE = Path(__file__).resolve().parent
RATE = 24000


class ReplicaClient(StageClientBase):
    """The orchestrator's client of one Code2Wav replica process (module docstring)."""

    def __init__(self, spec: Path, name: str, replica_id: int, stage_id: int = 2) -> None:
        self.stage_id = stage_id
        self.replica_id = replica_id
        self.model_stage = "code2wav"
        self.final_output = True
        self.final_output_type = "audio"
        self.engine_input_source = [stage_id - 1]
        self.default_sampling_params = None
        self.name = name
        self.added: list[str] = []  # in order, each time (a session's later turns again)
        self.segment_ends: list[str] = []  # request ids, one per segment the process ended
        self.lines = 0  # lines read from the process
        # requests whose end the process held back (`withhold_ends` in the spec): ended at its
        # adapter, their finish never reached the orchestrator
        self.withheld: list[str] = []
        self.ready = threading.Event()  # its receiver took its group over
        self._queue: queue.Queue[Any] = queue.Queue()
        read, write = os.pipe()
        command = [sys.executable, str(HERE / "stage_procs.py"), "replica", str(spec), name]
        self.process = subprocess.Popen(
            [*command, str(replica_id), str(write)],
            cwd=HERE,
            stdin=subprocess.PIPE,
            pass_fds=(write,),
            text=True,
        )
        os.close(write)
        self._reader = threading.Thread(target=self._read, args=(read,), daemon=True)
        self._reader.start()

    # ---------------------------------------------------------------- what the orchestrator calls
    async def add_request_async(self, request: Any, *args: Any, **kwargs: Any) -> None:
        self._send(f"add {request.request_id}")
        self.added.append(str(request.request_id))

    async def get_output_async(self) -> Any:
        outputs = drained(self._queue)
        if not outputs and self.dead:
            raise EngineDeadError()
        return OmniEngineCoreOutputs(outputs=outputs, timestamp=time.monotonic())

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            if not self.dead:
                self._send(f"abort {rid}")

    def check_health(self) -> None:
        if self.dead:
            raise EngineDeadError()

    def shutdown(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)

    # ------------------------------------------------------------------------------ the process
    @property
    def dead(self) -> bool:
        """The process is gone and everything it wrote was read."""
        return self.process.poll() is not None and not self._reader.is_alive()

    def _send(self, line: str) -> None:
        if self.dead:
            raise EngineDeadError()
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise EngineDeadError() from exc

    def _read(self, fd: int) -> None:
        with os.fdopen(fd) as lines:
            for line in lines:
                if line.endswith("\n"):  # a line cut by a kill was never sent
                    self.lines += 1
                    item = json.loads(line)
                    if item.get("ready"):
                        self.ready.set()
                    elif item.get("withheld"):
                        self.withheld.append(item["rid"])
                    else:
                        if "segment_end" in item:
                            self.segment_ends.append(item["rid"])
                        self._queue.put(_output(item))


def _output(item: dict[str, Any]) -> Any:
    rid = item["rid"]
    if item.get("end") == "failed":
        return OmniEngineCoreOutput(
            request_id=rid,
            new_token_ids=[],
            finish_reason=FinishReason.ERROR,
            stop_reason=item.get("reason") or "failed",
        )
    if "segment_end" in item:  # a resumable request's segment: not its end
        return OmniEngineCoreOutput(
            request_id=rid,
            new_token_ids=[0],
            finish_reason=FinishReason.STOP,
            is_segment_finished=True,
        )
    if item.get("end") == "finished":
        return OmniEngineCoreOutput(
            request_id=rid, new_token_ids=[0], finish_reason=FinishReason.STOP
        )
    codes = item["seen"]["prompt_token_ids"]
    waveform = {
        "model_outputs": torch.tensor(codes, dtype=torch.float32),
        "sr": torch.tensor(RATE, dtype=torch.int32),
    }
    return OmniEngineCoreOutput(request_id=rid, new_token_ids=[0], multimodal_output=waveform)


def codes_of(waveform: Any) -> list[int]:
    """The codes a waveform of this client carries."""
    return [int(v) for v in torch.as_tensor(waveform).round().tolist()]
