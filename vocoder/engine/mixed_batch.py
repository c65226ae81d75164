"""A decode step of many streams at mixed positions, and the model calls it costs: for the
benchmarks, the tests and the device check (docs/vocoder.md, "Ragged batching")."""

from __future__ import annotations

import random
from collections.abc import Sequence

from codeclog.vocoder.engine.code2wav import Code2WavEngine, DecodeCalls
from codeclog.vocoder.engine.window_checks import DecodeItem
from codeclog.vocoder.shared import stream_seed

SILENCE = 4218
WINDOW_IDS = 28  # 25 new ids + 3 lookahead


def mixed_position_items(
    engine: Code2WavEngine, streams: int = 100, max_windows: int = 4, seed: int = 0
) -> list[DecodeItem]:
    """One item per stream; stream s has decoded s % (max_windows + 1) windows first (those
    prefixes are decoded with `engine`, in batches)."""
    rng = random.Random(seed)
    states = [engine.setup(seed=stream_seed(f"mixed-{s}", 0)) for s in range(streams)]
    done = [s % (max_windows + 1) for s in range(streams)]
    for position in range(max_windows):
        rows = [s for s in range(streams) if done[s] > position]
        if not rows:
            break
        items = [(states[s], _window(rng, position, WINDOW_IDS), False) for s in rows]
        for s, (_, state) in zip(rows, engine.decode_batch(items), strict=True):
            states[s] = state
    items_out: list[DecodeItem] = []
    for s in range(streams):
        final = s % 4 == 3
        length = rng.randint(1, WINDOW_IDS - 1) if final else WINDOW_IDS
        items_out.append((states[s], _window(rng, done[s], length), final))
    return items_out


def decode_calls(engine: Code2WavEngine, items: Sequence[DecodeItem]) -> DecodeCalls:
    """Decode `items` as one step; the flow and HiFT calls it took."""
    before = engine.calls.copy()
    engine.decode_batch(items)
    return engine.calls.since(before)


def _window(rng: random.Random, position: int, length: int) -> list[int]:
    if position == 0:  # a stream's first window opens with the talker's 3 silence ids
        return [SILENCE] * min(3, length) + [rng.randrange(6561) for _ in range(length - 3)]
    return [rng.randrange(6561) for _ in range(length)]
