"""Real-time factor of the Token2wav flow (tokens -> mel) per stream, by batch size.

Each stream is set up from a seeded random prompt, decoded one untimed canonical window (25 new
+ 3 lookahead ids = 1.0 s of audio) to warm up, then timed over `--windows` more windows. All
streams of a batch advance together in one `decode_chunk_batch` call per window.

- RTF per stream = wall seconds per window / 1.0 s: what each stream of the batch experiences
  (below 1.0 keeps up with real time);
- aggregate RTF = wall seconds per window / (batch x 1.0 s): cost per second of audio produced.

Both use the best timed window: on a shared machine other load only ever adds time (the mean
is printed too).

`--gemms whole,tiled` times each batch both ways: one GEMM over the batch (a GPU engine) and
GEMMs over fixed row tiles (`tiled_gemms`, what a batch-invariant CPU engine does); the last
column is the tiled time over the whole-batch time at that batch. `tiled:N` times tiles of N rows
instead of the engine's CPU_GEMM_TILE (how the tile size was chosen: BENCHMARKS.md, "Issue 61").

Run: python -m bench.bench_flow [--configs tiny,full] [--batches 1,4,16] [--device cpu|cuda]
Prints one Markdown table row per (config, batch, GEMMs) and the exact command.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

WINDOW_IDS = 28  # 25 fresh + 3 lookahead
AUDIO_SECONDS_PER_WINDOW = 1.0  # 25 ids x 40 ms


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python -m bench.bench_flow --configs full --batches 1,4 --device cuda",
    )
    parser.add_argument("--configs", default="tiny,full", help="comma list of tiny, full")
    parser.add_argument("--batches", default="1,4,16", help="comma list of batch sizes")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    parser.add_argument(
        "--windows", type=int, default=None, help="timed windows (default: tiny 5, full 2)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=25, help="prompt length in ids")
    parser.add_argument(
        "--gemms",
        default="whole",
        help="comma list of whole (one GEMM per batch), tiled (fixed row tiles), tiled:N",
    )
    parser.add_argument("--n-timesteps", type=int, default=10, help="Euler steps per window")
    parser.add_argument("--seed", type=int, default=7, help="seed of prompts and ids")
    return parser.parse_args(argv)


def make_streams(flow: Any, batch: int, prompt_tokens: int, seed: int) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, flow.config.vocab_size, (prompt_tokens,), generator=g)
    mel = torch.randn(2 * prompt_tokens, flow.config.mel_dim, generator=g)
    spk = torch.randn(flow.config.spk_embed_dim, generator=g)
    state = flow.prepare_prompt(ids, mel, spk)  # one voice, shared by every stream
    return [state] * batch


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_batch(flow: Any, args: argparse.Namespace, batch: int, windows: int) -> dict[str, float]:
    """Best and mean wall seconds per window over `windows` timed windows (after a warm-up)."""
    import torch

    g = torch.Generator().manual_seed(args.seed + batch)
    states = make_streams(flow, batch, args.prompt_tokens, args.seed)
    tokens = torch.randint(0, flow.config.vocab_size, (windows + 1, batch, WINDOW_IDS), generator=g)
    _, states = flow.decode_chunk_batch(states, tokens[0], False)  # warm-up, untimed
    seconds = []
    for window in range(1, windows + 1):
        synchronize(args.device)
        start = time.perf_counter()
        _, states = flow.decode_chunk_batch(states, tokens[window], False)
        synchronize(args.device)
        seconds.append(time.perf_counter() - start)
    # the best window: on a shared box, other load only ever adds time
    best = min(seconds)
    return {
        "best_s": best,
        "mean_s": sum(seconds) / len(seconds),
        "rtf_stream": best / AUDIO_SECONDS_PER_WINDOW,
        "rtf_aggregate": best / (batch * AUDIO_SECONDS_PER_WINDOW),
        "state_mb": states[0].nbytes / 2**20,
    }


def machine(args: argparse.Namespace) -> str:
    import torch

    if args.device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return (
        f"{platform.machine()} {os.cpu_count()} cores, {args.threads} threads, "
        f"torch {torch.__version__}"
    )


@contextlib.contextmanager
def gemm_scope(stable: Any, gemms: str) -> Iterator[None]:
    """whole: no scope; tiled: the engine's tiles; tiled:N: tiles of N rows (CPU_GEMM_TILE
    replaced for the scope)."""
    if gemms == "whole":
        yield
        return
    saved = stable.CPU_GEMM_TILE
    _, _, rows = gemms.partition(":")
    stable.CPU_GEMM_TILE = int(rows) if rows else saved
    try:
        with stable.tiled_gemms():
            yield
    finally:
        stable.CPU_GEMM_TILE = saved


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch  # after argparse: --help works without torch

    from codeclog.vocoder.flow import FlowConfig, Token2WavFlow, stable

    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda: no CUDA device is available", file=sys.stderr)
        return 2
    command = "python -m bench.bench_flow " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    rows = []
    for name in args.configs.split(","):
        config = getattr(FlowConfig, name.strip())()
        config = dataclasses.replace(config, n_timesteps=args.n_timesteps)
        flow = Token2WavFlow(config, device=args.device)
        windows = args.windows or (5 if name.strip() == "tiny" else 2)
        for batch in (int(b) for b in args.batches.split(",")):
            for gemms in args.gemms.split(","):
                print(
                    f"{name} batch {batch} {gemms}: timing {windows} window(s)...", file=sys.stderr
                )
                with gemm_scope(stable, gemms):
                    result = time_batch(flow, args, batch, windows)
                rows.append((name, batch, gemms, windows, result))
        del flow
    print(
        "\n| config | device | batch | GEMMs | timed windows | s / window (best, mean) "
        "| RTF per stream | aggregate RTF | state MB / stream | machine | vs whole |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    whole = {(n, b): r["best_s"] for n, b, g, _, r in rows if g == "whole"}
    for name, batch, gemms, windows, r in rows:
        base = whole.get((name, batch))
        ratio = f"{r['best_s'] / base:.2f}x" if base else "-"
        print(
            f"| {name} | {args.device} | {batch} | {gemms} | {windows} "
            f"| {r['best_s']:.3f}, {r['mean_s']:.3f} | {r['rtf_stream']:.3f} "
            f"| {r['rtf_aggregate']:.4f} | {r['state_mb']:.1f} | {machine(args)} | {ratio} |"
        )
    print(
        f"\ncommand: `{command.strip()}` (n_timesteps {args.n_timesteps}, "
        f"prompt {args.prompt_tokens} ids)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
