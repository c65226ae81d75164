"""Encode/decode throughput of the wire format for a realistic codec chunk.

    python -m bench.wire_codec [--records N]

Prints records/s (CPU time of this process, so a busy machine skews it less than wall time)
for: encode, decode of the latest version, decode of a v1-written chunk (schema resolution),
and fastavro's bare schemaless_reader on the same body as the floor to compare against.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable

from fastavro import schemaless_reader, schemaless_writer

from codeclog.schemas import catalog, wire
from codeclog.schemas.records import CodecChunk, to_dict
from codeclog.testing.upstream_streams import preroll_window

STEADY_WINDOW = preroll_window(
    "6f1c2a0e-1d7b-4c55-9d0e-2b8f4e7a9c31",
    range(3000, 3025),
    chunk_seq=12,
    produced_at_ms=1_760_000_000_000,
    producer_id="talker-0",
)


def _v1_bytes(chunk: CodecChunk) -> bytes:
    v1 = next(v for v in catalog.registry().versions if v.label == "codec_chunk.v1")
    values = {k: v for k, v in to_dict(chunk).items() if k != "streaming_condition_seq"}
    buffer = io.BytesIO(wire.MARKER + v1.fingerprint)
    buffer.seek(0, io.SEEK_END)
    schemaless_writer(buffer, v1.parsed, values)
    return buffer.getvalue()


def _rate(work: Callable[[], object], records: int) -> float:
    started = time.process_time()
    for _ in range(records):
        work()
    return records / (time.process_time() - started)


def measure(records: int) -> dict[str, float]:
    latest = wire.encode(STEADY_WINDOW)
    old = _v1_bytes(STEADY_WINDOW)
    parsed = catalog.registry().latest["codec_chunk"].parsed
    body = latest[wire.HEADER_BYTES :]
    return {
        "encode_per_s": _rate(lambda: wire.encode(STEADY_WINDOW), records),
        "decode_per_s": _rate(lambda: wire.decode(latest), records),
        "decode_v1_per_s": _rate(lambda: wire.decode(old), records),
        "fastavro_floor_per_s": _rate(lambda: schemaless_reader(io.BytesIO(body), parsed), records),
        "chunk_bytes": float(len(latest)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000, help="records per measurement")
    args = parser.parse_args(argv)
    result = measure(args.records)
    print(json.dumps({key: round(value) for key, value in result.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
