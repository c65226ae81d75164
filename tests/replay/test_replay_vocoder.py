"""Replay with the tiny vocoder: identical audio in two processes, WAVs that match the report."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import wave
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from codeclog.testing.upstream_streams import realistic_events
from tests.replay.captures import write_events

RunCli = Callable[[Sequence[str]], tuple[int, str, str]]  # the run_cli fixture

pytestmark = [pytest.mark.vocoder, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "tests" / "data" / "scenarios" / "01_clean_turn.jsonl"


@pytest.fixture(autouse=True)
def _needs_the_engine() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("codeclog.vocoder.engine")


def _replay_json_twice(path: Path) -> tuple[bytes, bytes]:
    """Two independent processes, run side by side (most of each run is importing torch)."""
    argv = [sys.executable, "-m", "codeclog.cli", "replay", str(path), "--vocoder", "tiny"]
    runs = [
        subprocess.Popen(
            [*argv, "--json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=280) for run in runs]
    for run, (_, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err.decode()
    return outputs[0][0], outputs[1][0]


@pytest.fixture
def small_capture(tmp_path: Path) -> Path:
    """Three one-turn sessions on two partitions: enough to batch, small enough for a CPU."""
    write_events(tmp_path / "small.ocf", realistic_events(random.Random(5), sessions=3, turns=1), 2)
    return tmp_path / "small.ocf"


def test_two_processes_give_byte_identical_audio() -> None:
    first, second = _replay_json_twice(SCENARIO)
    assert first == second
    audio = json.loads(first)["requests"]["r1"]["audio"]
    assert audio["samples"] > 0
    assert len(audio["sha256"]) == 64


def test_wav_files_hold_exactly_the_reported_audio(
    small_capture: Path, tmp_path: Path, run_cli: RunCli
) -> None:
    wav_dir = tmp_path / "wav"
    argv = ["replay", str(small_capture), "--vocoder", "tiny", "--json", "--wav-dir", str(wav_dir)]
    code, out, err = run_cli(argv)
    assert code == 0, err
    requests = json.loads(out)["requests"]
    assert len(requests) == 3
    for request_id, entry in requests.items():
        with wave.open(str(wav_dir / f"{request_id}.wav")) as wav:
            assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
            frames = wav.readframes(wav.getnframes())
        assert len(frames) // 2 == entry["audio"]["samples"] > 0
        assert hashlib.sha256(frames).hexdigest() == entry["audio"]["sha256"]


# The causal HiFT replay of SCENARIO's r1 (3 windows) per determinism domain: any process on any
# machine of that domain must give these bytes (portable kernels: every x86-64 CPU).
CAUSAL_R1_SHA256 = {
    "portable1:torch2.15:x86_64:causal": (
        "e32ad4d384bb687874b6b0f125cba098a4f271e3b42580f89226390387ba5c85"
    ),
}


def _causal_argv() -> list[str]:
    return ["replay", str(SCENARIO), "--vocoder", "tiny", "--hift", "causal", "--json"]


def test_causal_hift_replay_follows_scheme_b_and_its_pinned_bytes(run_cli: RunCli) -> None:
    """`--hift causal` end to end, in this process: each window's samples follow the causal
    HiFT's rule over its new mel frames (2 per new id; a non-final window's last 3 ids are
    lookahead): fixed 8-frame delay, the first audio led by 3840 zeros, the final window
    flushing the held 8 frames; the audio equals the bytes pinned for this domain."""
    from codeclog.vocoder.hift.causal_stream import emitted_samples

    code, out, err = run_cli(_causal_argv())
    assert code == 0, err
    report = json.loads(out)
    domain = report["determinism_domain"]
    assert domain.endswith(":causal")
    request = report["requests"]["r1"]
    decodes = [o for o in request["outcomes"] if o["kind"] == "decode"]
    mel_frames = [2 * (o["frames"] - (0 if o["final"] else 3)) for o in decodes]
    samples = [w["samples"] for w in request["audio"]["windows"]]
    assert len(samples) == 3 and samples == emitted_samples(mel_frames)
    assert sum(samples) == sum(mel_frames) * 480 + 3840
    if domain in CAUSAL_R1_SHA256:
        assert request["audio"]["sha256"] == CAUSAL_R1_SHA256[domain]


@pytest.mark.long  # ~15 s; CI: test_causal_hift_replay_follows_scheme_b_and_its_pinned_bytes
def test_causal_hift_replay_is_identical_in_two_processes(run_cli: RunCli) -> None:
    """One replay in a subprocess and one in this process (another global RNG state, other
    imports): the same report bytes."""
    other = subprocess.Popen(
        [sys.executable, "-m", "codeclog.cli", *_causal_argv()],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    code, out, err = run_cli(_causal_argv())
    theirs, their_err = other.communicate(timeout=280)
    assert code == 0 and other.returncode == 0, (err, their_err.decode())
    assert out.encode() == theirs
