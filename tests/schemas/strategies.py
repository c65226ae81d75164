"""Hypothesis strategies for every wire record type, shared by the tests of schemas/.

(Imported as `tests.schemas.strategies`: pytest puts the repository root on sys.path, see
`pythonpath` in pyproject.toml.)
"""

from __future__ import annotations

from hypothesis import strategies as st

from codeclog.schemas.records import (
    AudioChunk,
    CodecChunk,
    ControlEvent,
    ControlKind,
    DeadLetter,
    StreamCheckpoint,
)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=24)  # hypothesis text never holds lone surrogates: always UTF-8-able
BLOB = st.binary(max_size=64)

codec_chunks = st.builds(
    CodecChunk,
    request_id=TEXT,
    codes=st.lists(INT32, max_size=40).map(tuple),
    cache_epoch=INT32,
    chunk_seq=INT32,
    code_flat_numel=st.none() | INT32,
    codec_chunk_frames=INT32,
    codec_left_context_frames=INT32,
    last_chunk=st.booleans(),
    tts_is_last_chunk=st.booleans(),
    turn_end=st.booleans(),
    duplex_epoch=INT64,
    duplex_turn_id=INT64,
    llm_output_text_utf8=BLOB,
    segment_end=st.booleans(),
    ref_audio=st.none() | BLOB,
    ref_audio_sr=st.none() | INT32,
    prompt_cache_id=st.none() | TEXT,
    produced_at_ms=INT64,
    producer_id=TEXT,
    streaming_condition_seq=st.none() | INT64,
)
control_events = st.builds(
    ControlEvent,
    request_id=TEXT,
    kind=st.sampled_from(ControlKind),
    reason=TEXT,
    produced_at_ms=INT64,
    producer_id=TEXT,
)
audio_chunks = st.builds(
    AudioChunk,
    request_id=TEXT,
    cache_epoch=INT32,
    chunk_seqs=st.lists(INT32, max_size=8).map(tuple),
    window_index=INT32,
    sample_offset=INT64,
    sample_rate_hz=INT32,
    pcm_s16le=BLOB,
    sha256=TEXT,
    final=st.booleans(),
    duplex_epoch=INT64,
    duplex_turn_id=INT64,
    turn_end=st.booleans(),
    tts_is_last_chunk=st.booleans(),
    segment_end=st.booleans(),
    llm_output_text_utf8=BLOB,
    source_produced_at_ms=INT64,
    producer_id=TEXT,
)
dead_letters = st.builds(
    DeadLetter,
    reason=TEXT,
    source_topic=TEXT,
    source_partition=INT32,
    source_offset=INT64,
    raw_value=BLOB,
    raw_key=st.none() | BLOB,
    request_id=st.none() | TEXT,
    cache_epoch=st.none() | INT32,
    chunk_seq=st.none() | INT32,
    details_json=TEXT,
    error=TEXT,
    dead_lettered_at_ms=INT64,
    producer_id=TEXT,
    raw_value_truncated=st.booleans(),
    raw_value_size=INT64,
    raw_value_sha256=TEXT,
)
stream_checkpoints = st.builds(
    StreamCheckpoint,
    request_id=TEXT,
    input_topic=TEXT,
    input_partition=INT32,
    open=st.booleans(),
    cache_epoch=INT32,
    epoch_start_offset=INT64,
    last_offset=INT64,
    windows_emitted=INT32,
    samples_emitted=INT64,
    fold_state_json=TEXT,
    updated_at_ms=INT64,
    producer_id=TEXT,
    consumer_group=TEXT,
)
records = st.one_of(codec_chunks, control_events, audio_chunks, dead_letters, stream_checkpoints)
