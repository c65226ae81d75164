"""verify across determinism domains, on the real broker with the tiny vocoder.

Within the replay's domain a window must be byte-identical; audio written in another domain
(another CPU's native kernels, a GPU) must be identical or within the numeric bound; every
payload is rehashed. A capture replayed with the default (portable) kernels reproduces the bytes
of a portable consumer exactly, which is what "replay anywhere, bit for bit" means.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from confluent_kafka import Producer

from codeclog.cli import main
from codeclog.consumers.member.service import VocodeConfig, VocoderService
from codeclog.consumers.readers.verify import verify
from codeclog.kafka.reader import read_partition
from codeclog.kafka.topics import ensure_topics
from codeclog.schemas import wire
from codeclog.schemas.records import AudioChunk

pytestmark = [pytest.mark.kafka, pytest.mark.vocoder, pytest.mark.slow]
FOREIGN = "native:torch2.15:cpu:GenuineIntel:AVX512:t1"  # a CPU this test does not run on


class _Labelled:
    """A real engine whose audio is stamped with another domain (as another CPU would)."""

    def __init__(self, engine: Any, domain: str) -> None:
        self._engine, self.domain = engine, domain

    def __getattr__(self, name: str) -> Any:  # the engine's other EngineFacts members
        return getattr(self._engine, name)

    def setup(self, voice: Any = None, seed: int = 0) -> Any:
        return self._engine.setup(voice, seed)

    def decode_batch(self, items: Sequence[Any]) -> Any:
        return self._engine.decode_batch(items)

    def release(self, state: Any) -> None:
        self._engine.release(state)


@pytest.fixture(scope="module")
def portable_engine() -> Any:
    from codeclog.vocoder.engine import Code2WavEngine

    return Code2WavEngine.from_spec("tiny", kernels="portable")


def _vocode(stack: Any, engine: Any) -> None:
    config = VocodeConfig(group=stack.group, exit_when_idle_s=2.0)  # published before: drained
    VocoderService(stack.client, stack.topics, config, engine).run()


def _factory(engine: Any, seen: list[frozenset[str]]) -> Callable[[frozenset[str]], Any]:
    def build(domains: frozenset[str]) -> Any:
        seen.append(domains)
        return engine

    return build


def test_portable_audio_verifies_bytewise_and_a_capture_replays_to_its_bytes(
    stack: Any, portable_engine: Any, tmp_path: Any, capsys: Any
) -> None:
    stack.publish_sessions(sessions=3, seconds=4, seed=21)
    _vocode(stack, portable_engine)
    domains: list[frozenset[str]] = []
    report = verify(stack.client, stack.topics, _factory(portable_engine, domains))
    assert report.ok, report.to_dict()
    assert domains == [frozenset({portable_engine.domain})]
    assert report.comparisons == {"bytes": report.expected_windows} and not report.corrupt
    checkpoints = [
        wire.decode(record.value)
        for partition in range(stack.topics.partitions)
        for record in read_partition(stack.client, stack.topics.progress, partition, 0, None)
        if record.value
    ]
    assert checkpoints
    assert {c.determinism_domain for c in checkpoints} == {portable_engine.domain}  # type: ignore[union-attr]
    capture = tmp_path / "input.ocf"
    cluster = ["--bootstrap", stack.bootstrap]
    assert main(["capture", "--topic", stack.topics.chunks, "--out", str(capture), *cluster]) == 0
    capsys.readouterr()
    assert main(["replay", str(capture), "--vocoder", "tiny", "--json"]) == 0  # portable
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["determinism_domain"] == portable_engine.domain
    assert set(report.request_sha256) <= set(replayed["requests"])
    for rid, digest in report.request_sha256.items():
        assert replayed["requests"][rid]["audio"]["sha256"] == digest


def test_audio_of_another_domain_passes_by_the_bound_and_a_real_change_fails(
    stack: Any, tiny_engine: Any, portable_engine: Any, unique_name: Any
) -> None:
    stack.publish_sessions(sessions=3, seconds=4, seed=22)
    _vocode(stack, _Labelled(tiny_engine, FOREIGN))  # native bytes, labelled as another CPU
    report = verify(stack.client, stack.topics, portable_engine)
    assert report.ok, report.to_dict()
    assert report.domains == {FOREIGN: report.actual_windows}
    assert report.comparisons.get("bound", 0) > 0  # native and portable bytes differ here
    assert report.worst_bound_lsb <= report.bound["max_abs_lsb"]

    altered = _copy_audio(stack, unique_name, change=_louder_window)
    broken = verify(stack.client, altered, portable_engine)
    assert not broken.ok and len(broken.mismatched) == 1 and not broken.corrupt


def test_a_payload_that_does_not_match_its_hash_is_corrupt(
    stack: Any, tiny_engine: Any, unique_name: Any
) -> None:
    stack.publish_sessions(sessions=2, seconds=3, seed=23)
    _vocode(stack, tiny_engine)
    assert verify(stack.client, stack.topics, tiny_engine).ok
    altered = _copy_audio(stack, unique_name, change=_flipped_byte_same_hash)
    report = verify(stack.client, altered, tiny_engine)
    assert not report.ok and len(report.corrupt) == 1 and report.corrupt == report.mismatched


def _louder_window(chunk: AudioChunk) -> AudioChunk:
    """A real difference: one sample moved by 2000 LSB, hash recomputed (consistent)."""
    pcm = bytearray(chunk.pcm_s16le)
    sample = int.from_bytes(pcm[100:102], "little", signed=True)
    pcm[100:102] = max(-32768, min(32767, sample + 2000)).to_bytes(2, "little", signed=True)
    return dataclasses.replace(chunk, pcm_s16le=bytes(pcm), sha256=wire_sha(bytes(pcm)))


def _flipped_byte_same_hash(chunk: AudioChunk) -> AudioChunk:
    pcm = bytearray(chunk.pcm_s16le)
    pcm[10] ^= 0x01
    return dataclasses.replace(chunk, pcm_s16le=bytes(pcm))  # sha256 field left as it was


def wire_sha(pcm: bytes) -> str:
    import hashlib

    return hashlib.sha256(pcm).hexdigest()


def _copy_audio(stack: Any, unique_name: Any, change: Callable[[AudioChunk], AudioChunk]) -> Any:
    """The audio topic copied to a new one, the first non-empty window passed through `change`."""
    topics = dataclasses.replace(stack.topics, audio=unique_name("audio-copy"))
    ensure_topics(stack.client, topics)
    producer = Producer({**stack.client, "enable.idempotence": True})
    changed = False
    for partition in range(stack.topics.partitions):
        for record in read_partition(stack.client, stack.topics.audio, partition, 0, None):
            chunk = wire.decode(record.value)
            assert isinstance(chunk, AudioChunk)
            if not changed and len(chunk.pcm_s16le) > 200:
                chunk, changed = change(chunk), True
            producer.produce(topics.audio, key=record.key, value=wire.encode(chunk),
                             partition=partition)  # fmt: skip
    assert changed and producer.flush(30) == 0
    return topics
