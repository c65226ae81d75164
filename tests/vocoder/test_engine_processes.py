"""Determinism across processes, and the vocoder's import boundaries (checked in subprocesses).

Two fresh interpreters with different global RNG seeds (torch, numpy, random, and extra global
draws before and during the run) decode the golden stream: the PCM must be byte-identical,
because nothing in the vocoder may read the global RNG.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from codeclog.vocoder.domain import torch_release

pytestmark = [pytest.mark.vocoder, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "data" / "engine_golden_tiny.json"

DECODE_SCRIPT = """
import hashlib, random, sys
import numpy as np
import torch
seed = int(sys.argv[1])
random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
torch.rand(seed % 97 + 1)  # shift the global stream differently in each process
from codeclog.vocoder.engine import Code2WavEngine, pcm_s16le, stream_seed
from codeclog.vocoder.flow import canonical_windows
engine = Code2WavEngine.tiny(kernels=sys.argv[2] if len(sys.argv) > 2 else "native")
ids = [4218] * 3 + [(i * 7919 + 13) % 6561 for i in range(60)]
state = engine.setup(seed=stream_seed("golden-request", 0))
pcm = b""
for window, final in canonical_windows(ids):
    torch.randn(seed % 13 + 1)  # global draws between windows must not matter either
    [(audio, state)] = engine.decode_batch([(state, window, final)])
    pcm += pcm_s16le(audio)
print(hashlib.sha256(pcm).hexdigest())
"""


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONHASHSEED": args[0] if args else "0"}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> str:
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr[-2000:]
    return stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("kernels", ["native", "portable"])
def test_two_processes_with_different_global_seeds_give_identical_pcm(kernels: str) -> None:
    first = _spawn(DECODE_SCRIPT, "1", kernels)
    second = _spawn(DECODE_SCRIPT, "31337", kernels)
    digest_first, digest_second = _finish(first), _finish(second)
    assert len(digest_first) == 64
    assert digest_first == digest_second
    if kernels == "portable":  # the same stream as test_engine_streaming's golden
        golden = json.loads(GOLDEN.read_text())
        pinned = golden["sha256"].get(f"portable1:torch{torch_release()}:{platform.machine()}")
        if pinned is not None:
            assert digest_first == pinned


BOUNDARY_SCRIPT = """
import sys
import codeclog.vocoder.engine, codeclog.vocoder.fixture  # noqa: F401
import codeclog.vocoder.checkpoint, codeclog.vocoder.voice  # noqa: F401
banned = ("confluent_kafka", "fastavro", "avro")
ours = ("codeclog.schemas", "codeclog.consumers", "codeclog.producers")
print(sorted(n for n in sys.modules if n.split(".")[0] in banned or n.startswith(ours)))
"""


def test_vocoder_imports_neither_kafka_nor_avro_nor_records() -> None:
    assert _finish(_spawn(BOUNDARY_SCRIPT)) == "[]"


COMPILER_SCRIPT = """
import sys
from codeclog.vocoder.engine import Code2WavEngine
Code2WavEngine.tiny()
print(sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules))
"""


def test_building_an_engine_imports_no_torch_compiler() -> None:
    """Every `codeclog vocode` process builds one: torch._dynamo and torch._inductor (pulled in
    by torch.use_deterministic_algorithms, and by nn.Embedding's init on the meta device) took
    3 s of each start. The native engine needs neither (portable kernels, a TorchDispatchMode,
    still import torch._dynamo)."""
    assert _finish(_spawn(COMPILER_SCRIPT)) == "[]"
