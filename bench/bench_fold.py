"""Events per second of the tolerant fold, next to the Avro decode rate of the same records.

The fold must not be the consumer's bottleneck: the target is a fold at least 2x faster than
decoding the records it folds. Both are measured here in one run on the same seeded, realistic
stream (1000 interleaved duplex sessions of 4 turns, about 30 chunks each, made by
codeclog.testing.upstream_streams):

- `wire.decode`: schemas.wire.decode, bytes -> CodecChunk (what the consumer does per record);
- `fastavro`: fastavro.schemaless_reader alone, body bytes -> dict (the Avro floor);
- `fold`: consumers.stream.fold.rules.fold under the tolerant policy, CodecChunk -> outcomes, over
  records decoded long before (their codec ids are cold in the CPU caches: pessimistic);
- `fold, warm`: the same fold timed batch by batch right after `wire.decode` made the batch
  (untimed), as the consumer runs it.

Run: python -m bench.bench_fold [--sessions 1000] [--turns 4] [--repeat 5] [--seed 7]
Prints the rates, the ratios and a Markdown table row for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_reader

from codeclog.consumers.stream.fold.rules import fold
from codeclog.consumers.stream.fold.state import FoldConfig, Policy, new_state
from codeclog.schemas.records import CodecChunk
from codeclog.testing.upstream_streams import realistic_events

AVRO_DIR = Path(__file__).resolve().parent.parent / "schemas" / "avro"
SOE_HEADER_BYTES = 10  # C3 01 + 8-byte fingerprint (schemas.wire)
BATCH = 500  # records per consumer poll batch


def best_seconds(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """The least CPU time of each run over `rounds` interleaved rounds.

    CPU time, and rounds that alternate the runs, because the bench box is shared: whatever
    slows one run down in a round slows its neighbours too, so the ratios stay meaningful.
    """
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - start)
    return best


def fold_all(events: Sequence[CodecChunk]) -> int:
    state = new_state(FoldConfig(policy=Policy.TOLERANT))
    outcomes = 0
    for event in events:
        state, out = fold(state, event)
        outcomes += len(out)
    return outcomes


def fold_after_decode(values: Sequence[bytes], decode: Callable[[bytes], Any]) -> float:
    """CPU seconds of the fold alone, each batch folded right after it was decoded."""
    state = new_state(FoldConfig(policy=Policy.TOLERANT))
    spent = 0.0
    for start in range(0, len(values), BATCH):
        batch = [decode(value) for value in values[start : start + BATCH]]
        begin = time.process_time()
        for event in batch:
            state, _ = fold(state, event)
        spent += time.process_time() - begin
    return spent


def latest_chunk_schema() -> Any:
    paths = sorted(AVRO_DIR.glob("codec_chunk.v*.avsc"), key=lambda p: int(p.stem.split("v")[-1]))
    return parse_schema(json.loads(paths[-1].read_text()))


def fastavro_all(bodies: Sequence[bytes], schema: Any) -> int:
    total = 0
    for body in bodies:
        record = schemaless_reader(io.BytesIO(body), schema, None)
        assert isinstance(record, dict)
        total += len(record["codes"])
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000, help="interleaved sessions")
    parser.add_argument(
        "--repeat", type=int, default=5, help="interleaved rounds (the best of each wins)"
    )
    parser.add_argument("--turns", type=int, default=4, help="turns (epochs) per session")
    parser.add_argument("--seed", type=int, default=7, help="seed of the stream generator")
    args = parser.parse_args(argv)

    from codeclog.schemas import wire  # after argparse: --help must work without the wire module

    events = realistic_events(random.Random(args.seed), args.sessions, args.turns)
    values = [wire.encode(event) for event in events]
    bodies = [value[SOE_HEADER_BYTES:] for value in values]
    schema = latest_chunk_schema()
    print(f"{len(events)} records, {len(events) / args.sessions:.1f} per session", file=sys.stderr)

    runs: dict[str, Callable[[], object]] = {
        "wire.decode": lambda: [wire.decode(value) for value in values],
        "fastavro": lambda: fastavro_all(bodies, schema),
        "fold": lambda: fold_all(events),
    }
    seconds = best_seconds(runs, args.repeat)
    seconds["fold, warm"] = min(fold_after_decode(values, wire.decode) for _ in range(args.repeat))
    rates = {name: len(events) / s for name, s in seconds.items()}
    for name, rate in rates.items():
        print(f"{name:12s} {rate:12,.0f} events/s")
    for fold_name in ("fold", "fold, warm"):
        vs_decode = rates[fold_name] / rates["wire.decode"]
        vs_avro = rates[fold_name] / rates["fastavro"]
        print(f"{fold_name}: {vs_decode:.2f}x wire.decode, {vs_avro:.2f}x fastavro (target >= 2x)")
    command = (
        f"python -m bench.bench_fold --sessions {args.sessions} --turns {args.turns} "
        f"--repeat {args.repeat} --seed {args.seed}"
    )
    machine = (
        f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} cores, CPU time"
    )
    print(
        "\n| benchmark | records | fold ev/s (cold / warm) | wire.decode rec/s | fastavro rec/s "
        "| fold/wire.decode | fold/fastavro | machine | command |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    cold, warm = rates["fold"], rates["fold, warm"]
    decode, avro = rates["wire.decode"], rates["fastavro"]
    print(
        f"| fold (tolerant) vs Avro decode | {len(events)} | {cold:,.0f} / {warm:,.0f} "
        f"| {decode:,.0f} | {avro:,.0f} | {cold / decode:.2f}x / {warm / decode:.2f}x "
        f"| {cold / avro:.2f}x / {warm / avro:.2f}x | {machine} | `{command}` |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
