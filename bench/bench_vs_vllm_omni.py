"""codeclog's Code2Wav engine against vllm-omni 0.30's own batched Token2wav, same weights.

Run it with the vllm-omni environment's python (scripts/bootstrap.sh builds it; codeclog's
dependencies are in it), from the checkout's root, so that `codeclog` and `bench` are this
checkout's:

    PY=~/.cache/codeclog/omni-venv/bin/python
    $PY -m bench.bench_vs_vllm_omni                          # tiny fixture, CPU, b = 1, 4, 16
    $PY -m bench.bench_vs_vllm_omni --spec full --windows 1 --rounds 1   # published sizes
    $PY -m bench.bench_vs_vllm_omni --device cuda --spec full            # the peer's CUDA graphs
    $PY -m bench.bench_vs_vllm_omni --quick                  # smoke run: seconds after imports

The peer is `BatchedToken2Wav` as vllm-omni's MiniCPM-o 4.5 Code2Wav stage drives it: one
`decode_batch` call per window position for the B streams (one equal-shape bucket), HiFT and
DiT CUDA graphs on a GPU (the settings of vllm-omni's deploy/minicpmo_4_5.yaml, HiFT graphs
captured at the bench's batch sizes), eager torch on the CPU. See bench/vllm_omni_peer.py for
how it is built: it holds a copy of the very tensors codeclog decodes with (`--spec tiny`: the
committed fixture; `full`: seeded random weights at the published sizes; a directory: a
checkpoint). Both decode the same streams (MiniCPM-o's 25 + 3 windows, 3 silence ids first,
stream i its own ids and noise seed i) with codeclog's default voice, whose prompt features are
handed to the peer as its `PromptFeatures`; prompt setup is excluded from the timings.

Per batch size B the contenders take turns, round by round (codeclog first in odd rounds, the
peer first in even ones), each decoding B fresh streams from the first window to the last; each
keeps its fastest round. Reported per contender: windows/s (B x windows / wall), RTF per stream
(wall / audio of one stream), first-window latency (the first decode call of fresh streams),
peak memory per stream (CPU: the process's peak RSS above its level before the round, sampled
every 2 ms in round 1, / B; CUDA: torch's peak allocation above the idle level, / B).

Audio: every window of every stream is compared as s16 PCM (max |difference| in LSB, SNR in dB,
bit-exact windows): codeclog's from its timed rounds, the peer's from one more, untimed pass in
which its HiFT draws codeclog's noise for each row (bench/vllm_omni_peer.codeclog_noise;
otherwise it draws from the global RNG, and no two decodes could match; on CUDA that pass runs
its HiFT eagerly, as its graphs replay the noise drawn when they were captured). Batch invariance:
stream 0's audio at each B against its audio at the first batch size, for both.

Settings the comparison fixes, printed with the results: codeclog runs its defaults for the
device (on the CPU: native kernels, exact batching, batch-invariant, 1 intra-op thread, one
decode worker per core up to 4) with the peer's conformer-cache trim rule (`packed`,
minicpmo-utils 1.0.5's, which vllm-omni 0.30 applies; codeclog's default `per_scale` changes
the audio from the 4th window on, not the cost); the peer runs torch's default settings, one row
per intra-op thread count (`--peer-threads`, default 1 and torch's default for the machine: on
a shared box a second OpenMP thread can cost more than it gives). `--codeclog` adds rows for
other codeclog engines (`portable`: the cross-CPU kernels; `ragged`: the opt-in batching whose
rows are within a bound of solo; `one-worker`; `invariant`: batch-invariant wherever it runs, on
CUDA the tiled GEMMs), measured in the same rounds.

Output: one line per batch size (codeclog's default engine against the fastest peer row), a
markdown table of every contender, the machine, the settings and the exact command. Expected
time on 2 CPU cores: the default (tiny) about a minute plus 25 s of imports and building; `--spec
full --windows 1 --rounds 2` about 9 minutes (b = 16 decodes one window of 16 published-size
streams per contender and round, 25-40 s each).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from bench.bench_vocoder import published_random_weights, schedule
from bench.peak_memory import PeakMemory
from bench.vllm_omni_peer import Peer, PeerUnavailableError, codeclog_noise
from codeclog.consumers.readers.audio_compare import Bound, compare_bound
from codeclog.vocoder.checkpoint import inspect_checkpoint, load_checkpoint, load_fixture
from codeclog.vocoder.determinism import CUBLAS_WORKSPACE_CONFIG, apply_determinism, window_seed
from codeclog.vocoder.engine import Code2WavEngine
from codeclog.vocoder.engine.options import EngineOptions
from codeclog.vocoder.engine.stream_state import StreamState
from codeclog.vocoder.flow import ConformerTrim, FlowConfig, Token2WavFlow
from codeclog.vocoder.hift.noncausal import HiFTGenerator, build_hift
from codeclog.vocoder.shared import pcm_s16le
from codeclog.vocoder.voice import default_voice

SAMPLE_RATE = 24000
PEER = "vllm-omni"
DEFAULT = "codeclog"
# --codeclog NAME: the engine options of the extra rows
MODES: dict[str, EngineOptions] = {
    "portable": {"kernels": "portable"},
    "ragged": {"batching": "ragged"},
    "one-worker": {"workers": 1},
    "invariant": {"batch_invariant": True},  # on CUDA: the tiled GEMMs (CUDA_GEMM_TILE rows)
}
QUICK = {"spec": "tiny", "batches": "1,2", "windows": 2, "rounds": 1, "peer_threads": "1"}
Plan = list[tuple[tuple[int, ...], bool]]


# ---------------------------------------------------------------------------------------------
# The contenders


class Contender(Protocol):
    name: str

    def prepare(self) -> None:
        """Thread settings and the like, before each of its runs."""

    def setup(self, batch: int) -> list[Any]: ...

    def decode(
        self, states: Sequence[Any], windows: Sequence[tuple[int, ...]], final: bool, position: int
    ) -> tuple[list[np.ndarray], list[Any]]: ...


@dataclasses.dataclass(frozen=True)
class TorchSettings:
    """The process-wide torch settings each contender runs under: codeclog's engine applies its
    determinism settings (vocoder.determinism), the peer runs with torch's defaults as the
    bench found them (as in a vllm-omni process), its own thread count."""

    threads: int
    debug_mode: int
    cudnn: tuple[bool, bool, bool]  # benchmark, deterministic, allow_tf32
    matmul_tf32: bool

    @classmethod
    def now(cls) -> TorchSettings:
        backends = torch.backends
        return cls(
            torch.get_num_threads(),
            torch.get_deterministic_debug_mode(),
            (backends.cudnn.benchmark, backends.cudnn.deterministic, backends.cudnn.allow_tf32),
            backends.cuda.matmul.allow_tf32,
        )

    def apply(self, threads: int) -> None:
        torch.set_num_threads(threads)
        torch.set_deterministic_debug_mode(self.debug_mode)
        cudnn = torch.backends.cudnn
        cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 = self.cudnn
        torch.backends.cuda.matmul.allow_tf32 = self.matmul_tf32


@dataclasses.dataclass
class Codeclog:
    name: str
    engine: Code2WavEngine

    def prepare(self) -> None:
        apply_determinism(self.engine.device, self.engine.determinism.threads)

    def setup(self, batch: int) -> list[Any]:
        return [self.engine.setup(seed=stream) for stream in range(batch)]

    def decode(
        self, states: Sequence[Any], windows: Sequence[tuple[int, ...]], final: bool, position: int
    ) -> tuple[list[np.ndarray], list[Any]]:
        del position  # the states carry their window index
        items: list[tuple[StreamState, Sequence[int], bool]] = [
            (state, ids, final) for state, ids in zip(states, windows, strict=True)
        ]
        results = self.engine.decode_batch(items)
        return [audio for audio, _ in results], [state for _, state in results]


@dataclasses.dataclass
class VllmOmni:
    name: str
    peer: Peer
    threads: int
    defaults: TorchSettings
    aligned_noise: bool = False  # the compare pass: codeclog's HiFT noise for every row

    def prepare(self) -> None:
        self.defaults.apply(self.threads)

    def setup(self, batch: int) -> list[Any]:
        return self.peer.setup(batch)

    def decode(
        self, states: Sequence[Any], windows: Sequence[tuple[int, ...]], final: bool, position: int
    ) -> tuple[list[np.ndarray], list[Any]]:
        if not self.aligned_noise:
            return self.peer.decode(states, windows, final)
        seeds = [window_seed(stream, position) for stream in range(len(states))]
        harmonics = self.peer.hift_config.nb_harmonics + 1
        with self.peer.eager_hift(), codeclog_noise(seeds, harmonics):
            return self.peer.decode(states, windows, final)


# ---------------------------------------------------------------------------------------------
# One run: B streams from the first window to the last


@dataclasses.dataclass
class Run:
    wall_s: float
    first_s: float
    audio: list[list[np.ndarray]]  # [stream][window]
    peak_bytes: int | None = None

    def audio_s(self) -> float:
        """Audio of one stream (every stream gets the same amount)."""
        return sum(len(window) for window in self.audio[0]) / SAMPLE_RATE


def decode_streams(contender: Contender, plans: Sequence[Plan], device: torch.device) -> Run:
    contender.prepare()
    states = contender.setup(len(plans))
    audio: list[list[np.ndarray]] = [[] for _ in plans]
    first = 0.0
    _synchronize(device)
    start = time.perf_counter()
    for position in range(len(plans[0])):
        windows = [plan[position][0] for plan in plans]
        out, states = contender.decode(states, windows, plans[0][position][1], position)
        if position == 0:
            first = time.perf_counter() - start
        for stream, samples in enumerate(out):
            audio[stream].append(samples)
    wall = time.perf_counter() - start
    return Run(wall, first, audio)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------
# Audio


@dataclasses.dataclass(frozen=True)
class Agreement:
    windows: int
    exact: int
    max_lsb: int
    min_snr_db: float

    def headline(self) -> str:
        if self.exact == self.windows:
            return "bit-exact"
        return f"SNR {self.min_snr_db:.0f} dB, max {self.max_lsb} LSB"

    def describe(self) -> str:
        if self.exact == self.windows:
            return f"bit-exact ({self.windows} windows)"
        return (
            f"{self.exact}/{self.windows} windows bit-exact, max {self.max_lsb} LSB, "
            f"min SNR {self.min_snr_db:.1f} dB"
        )


def agreement(a: Sequence[Sequence[np.ndarray]], b: Sequence[Sequence[np.ndarray]]) -> Agreement:
    """Every window of every stream of `a` against `b`, as s16le PCM."""
    windows = exact = worst = 0
    snr = math.inf
    for stream_a, stream_b in zip(a, b, strict=True):
        for window_a, window_b in zip(stream_a, stream_b, strict=True):
            pcm_a, pcm_b = pcm_s16le(window_a), pcm_s16le(window_b)
            verdict = compare_bound(pcm_a, pcm_b, Bound())
            windows += 1
            exact += pcm_a == pcm_b
            worst = max(worst, verdict.max_abs_lsb)
            snr = min(snr, verdict.snr_db)
    return Agreement(windows, exact, worst, snr)


# ---------------------------------------------------------------------------------------------
# Weights and contenders


def load_weights(spec: str) -> tuple[Token2WavFlow, HiFTGenerator]:
    """tiny: the committed fixture; full: seeded random weights at the published sizes;
    anything else: a checkpoint directory."""
    if spec == "tiny":
        return load_fixture()
    if spec == "full":
        return published_random_weights()
    return load_checkpoint(inspect_checkpoint(spec))


def flow_copy(flow: Token2WavFlow, config: FlowConfig | None = None) -> Token2WavFlow:
    """A flow holding a copy of `flow`'s weights, under `config` (default: flow's)."""
    copy = Token2WavFlow(config or flow.config, device="meta")
    copy.load_state_dict({k: v.clone() for k, v in flow.state_dict().items()}, assign=True)
    copy.fill_buffers()
    return copy


def hift_copy(hift: HiFTGenerator) -> HiFTGenerator:
    copy = build_hift(hift.config)
    copy.load_state_dict(hift.state_dict(), strict=True)
    return copy


def with_packed_trim(flow: Token2WavFlow) -> Token2WavFlow:
    """The same weights under the conformer-cache trim rule the peer applies."""
    config = dataclasses.replace(flow.config, conformer_trim=ConformerTrim.PACKED)
    return flow if config == flow.config else flow_copy(flow, config)


def build_contenders(
    args: argparse.Namespace, defaults: TorchSettings
) -> tuple[list[Contender], VllmOmni]:
    device = torch.device(args.device)
    flow, hift = load_weights(args.spec)
    flow = with_packed_trim(flow)
    batches = parse_batches(args.batches)
    # the peer copies the tensors first: an engine takes ownership (fuses HiFT's weight norm)
    peer = Peer(
        flow.config, hift.config, flow, hift, default_voice(flow.config), str(device), batches
    )
    contenders: list[Contender] = []
    names = [DEFAULT, *args.codeclog]
    for name in names:
        options: EngineOptions = {"device": str(device)}
        options.update(MODES.get(name, {}))
        last = name == names[-1]  # the others get copies: each engine owns its modules
        modules = (flow, hift) if last else (flow_copy(flow), hift_copy(hift))
        engine = Code2WavEngine(*modules, spec=args.spec, **options)
        contenders.append(Codeclog(name if name == DEFAULT else f"codeclog {name}", engine))
    for threads in args.peer_threads:
        name = peer_name(threads, args.peer_threads)
        contenders.append(VllmOmni(name, peer, threads, defaults))
    aligned = VllmOmni(PEER, peer, args.peer_threads[-1], defaults, aligned_noise=True)
    return contenders, aligned


def peer_name(threads: int, all_threads: Sequence[int]) -> str:
    plural = "s" if threads > 1 else ""
    return PEER if len(all_threads) == 1 else f"{PEER} ({threads} thread{plural})"


def parse_batches(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


# ---------------------------------------------------------------------------------------------
# The measurement


@dataclasses.dataclass
class Cell:
    """One contender at one batch size: its fastest round and its audio."""

    best: Run
    first_s: float
    peak_bytes: int | None


def measure_batch(
    contenders: Sequence[Contender],
    plans: Sequence[Plan],
    rounds: int,
    device: torch.device,
    memory: bool,
) -> dict[str, Cell]:
    cells: dict[str, Cell] = {}
    for round_index in range(rounds):
        order = contenders if round_index % 2 == 0 else list(reversed(contenders))
        for contender in order:
            sampled = memory and round_index == 0
            meter = PeakMemory(device)
            with meter.measuring() if sampled else contextlib.nullcontext():
                run = decode_streams(contender, plans, device)
            cell = cells.get(contender.name)
            if cell is None:
                cells[contender.name] = Cell(
                    run, run.first_s, meter.peak_bytes if sampled else None
                )
                continue
            cell.first_s = min(cell.first_s, run.first_s)
            if run.wall_s < cell.best.wall_s:
                cell.best = run
    return cells


def windows_per_s(run: Run) -> float:
    return len(run.audio) * len(run.audio[0]) / run.wall_s


def fastest_peer(cells: dict[str, Cell]) -> str:
    peers = [name for name in cells if name.startswith(PEER)]
    return max(peers, key=lambda name: windows_per_s(cells[name].best))


def report_line(batch: int, cells: dict[str, Cell], match: Agreement | None) -> str:
    peer = fastest_peer(cells)
    ours, theirs = windows_per_s(cells[DEFAULT].best), windows_per_s(cells[peer].best)
    audio = "" if match is None else f"; {match.headline()}"
    return (
        f"b={batch}: codeclog {ours:.1f} windows/s, {peer} {theirs:.1f} windows/s: "
        f"{ours / theirs:.2f}x{audio}"
    )


def table_rows(
    batch: int, cells: dict[str, Cell], matches: dict[str, Agreement], invariance: dict[str, str]
) -> list[str]:
    peer_rate = windows_per_s(cells[fastest_peer(cells)].best)
    rows = []
    for name, cell in cells.items():
        run = cell.best
        rate = windows_per_s(run)
        memory = "" if cell.peak_bytes is None else f"{cell.peak_bytes / batch / 2**20:.1f}"
        match = matches.get(name)
        rows.append(
            f"| {batch} | {name} | {rate:.2f} | {rate / peer_rate:.2f}x | "
            f"{run.wall_s / run.audio_s():.3f} | {cell.first_s:.3f} | {memory} | "
            f"{'-' if match is None else match.describe()} | {invariance.get(name, '-')} |"
        )
    return rows


TABLE_HEAD = [
    "| b | contender | windows/s | x fastest vllm-omni | RTF / stream | first window s "
    "| peak MiB / stream "
    "| audio vs vllm-omni | stream 0 vs its smallest-batch audio |",
    "|---:|---|---:|---:|---:|---:|---:|---|---|",
]


def invariance_of(
    audio: Sequence[Sequence[np.ndarray]], reference: Sequence[Sequence[np.ndarray]] | None
) -> str:
    """Stream 0's audio against its audio at the first batch size."""
    if reference is None:
        return "(reference)"
    match = agreement(audio[:1], reference[:1])
    return "identical" if match.exact == match.windows else match.describe()


# ---------------------------------------------------------------------------------------------
# The machine and the command


def machine() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    return f"{model}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def settings(contenders: Sequence[Contender], args: argparse.Namespace) -> list[str]:
    lines = []
    for contender in contenders:
        if isinstance(contender, Codeclog):
            info = contender.engine.describe()
            # Ragged batching overrides the option: its rows are within a bound of a solo decode.
            invariant = bool(info["batch_invariant"]) and info["batching"] == "exact"
            tile = info["gemm_tile_rows"]
            tiles = f"GEMM tiles of {tile} rows" if tile else "no GEMM tiles"
            lines.append(
                f"- {contender.name}: kernels {info['kernels']}, batching {info['batching']}, "
                f"batch-invariant {invariant} ({tiles}), {contender.engine.determinism.threads}"
                f" intra-op thread(s), {info['workers']} decode worker(s), domain "
                f"`{info['domain']}`"
            )
        elif isinstance(contender, VllmOmni):
            graphs = "CUDA graphs (HiFT, DiT)" if args.device.startswith("cuda") else "eager"
            lines.append(
                f"- {contender.name}: BatchedToken2Wav (vllm-omni {_version('vllm_omni')}), "
                f"{graphs}, {contender.threads} intra-op thread(s)"
            )
    return lines


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package.replace("_", "-"))
    except PackageNotFoundError:
        return "?"


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_vs_vllm_omni",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--spec", default="tiny", help="tiny (default), full, or a checkpoint dir")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--batches", default="1,4,16", help="concurrent streams (default 1,4,16)")
    parser.add_argument(
        "--windows", type=int, default=3, help="windows per stream, the last final (default 3; "
        "1: one non-final 25 + 3 window, the steady-state cost)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="turns per batch size (default 3)")
    parser.add_argument(
        "--peer-threads", default="", help="the peer's intra-op thread counts, one row each, "
        "comma-separated (default: 1 and torch's default here); the line compares codeclog "
        "with the fastest",
    )  # fmt: skip
    parser.add_argument(
        "--codeclog", default="", help=f"extra codeclog rows, comma-separated: {', '.join(MODES)}"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the RSS sampling")
    parser.add_argument("--no-compare", action="store_true", help="skip the audio comparison")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK}")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    default_threads = torch.get_num_threads()
    threads = parse_batches(args.peer_threads) or sorted({1, default_threads})
    args.peer_threads = threads
    args.codeclog = [name for name in args.codeclog.split(",") if name]
    unknown = [name for name in args.codeclog if name not in MODES]
    if unknown:
        parser.error(f"unknown --codeclog rows {unknown}; known: {', '.join(MODES)}")
    if args.windows < 1 or args.rounds < 1 or min(parse_batches(args.batches), default=0) < 1:
        parser.error("--windows, --rounds and every batch size must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":  # codeclog's deterministic cuBLAS needs it before CUDA starts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    started = time.perf_counter()
    defaults = TorchSettings.now()  # before an engine applies codeclog's
    try:
        contenders, aligned = build_contenders(args, defaults)
    except PeerUnavailableError as exc:
        print(f"bench_vs_vllm_omni: {exc}", file=sys.stderr)
        return 2
    print(f"built both in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    for contender in contenders:  # warm-up: first calls, kernel selection
        decode_streams(contender, [schedule(0, 1)], device)
    lines, rows = [], [*TABLE_HEAD]
    smallest: dict[str, Sequence[Sequence[np.ndarray]]] = {}
    for batch in parse_batches(args.batches):
        plans = [schedule(stream, args.windows) for stream in range(batch)]
        cells = measure_batch(contenders, plans, args.rounds, device, not args.no_memory)
        matches: dict[str, Agreement] = {}
        invariance: dict[str, str] = {}
        if not args.no_compare:
            peer_audio = decode_streams(aligned, plans, device).audio
            for name, cell in cells.items():
                if not name.startswith(PEER):
                    matches[name] = agreement(cell.best.audio, peer_audio)
                    invariance[name] = invariance_of(cell.best.audio, smallest.get(name))
                    smallest.setdefault(name, cell.best.audio)
            # the peer's own: judged on the pass whose noise is codeclog's (its own is random)
            peer_invariance = invariance_of(peer_audio, smallest.get(PEER))
            smallest.setdefault(PEER, peer_audio)
            invariance.update({name: peer_invariance for name in cells if name.startswith(PEER)})
        lines.append(report_line(batch, cells, matches.get(DEFAULT)))
        rows += table_rows(batch, cells, matches, invariance)
        print(lines[-1], file=sys.stderr, flush=True)
    command = "python -m bench.bench_vs_vllm_omni " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    report = "\n".join(
        [
            *lines,
            "",
            f"spec `{args.spec}`, device `{args.device}`, {args.windows} window(s) per stream, "
            f"fastest of {args.rounds} round(s); torch {torch.__version__} (default "
            f"{defaults.threads} intra-op threads); {machine()}",
            *settings(contenders, args),
            "",
            *rows,
            "",
            f"Command: `{command.strip()}` ({time.perf_counter() - started:.0f} s)",
        ]
    )
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
