"""The prepared GPU device check: flow, HiFT (scheme A and the causal scheme B) and engine at the
published sizes with random weights, on a machine that has only torch and numpy.

    python -m bench.device_check                 # cuda, full sizes, < 8 minutes
    python -m bench.device_check --quick --device cpu   # tiny sizes, seconds

(from the checkout's root: no install needed)

Measures (each section is timed against one global budget, `--budget-s`; a section that would
start after the budget is recorded as skipped and the results so far are always written):

- flow, HiFT A, HiFT B, engine: RTF per stream (wall / audio of one stream), windows/s and
  aggregate audio seconds per wall second at each batch size (canonical 25 + 3 windows,
  1.0 s of audio each, after one untimed warm-up window per batch size);
- first-window latency at batch 1: a new stream's first decode_batch call, warm engine;
- decode calls per step for a mixed-position batch: 16 streams at 4 different window positions
  in one decode_batch call; the flow and HiFT calls are counted by wrapping their entry points
  (the engine's own counter is used too when it has one, see `engine_counter`);
- peak GPU memory per stream (peak during a batch minus the idle baseline, over B) and the
  streams that fit in the budget (`--memory-budget-gib`, default 90 % of the GPU);
- determinism: the same batch decoded twice from fresh states, PCM sha256 compared;
- the largest difference from the CPU path (same weights, batch 1, one window).

Writes `device_check.json` and `device_check.md` into `--out` (default: $OUT, else bench/out).
Needs only torch and numpy: pyyaml (read only for flow.yaml, never here) is stubbed when absent.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

OUT_DIR = Path(__file__).resolve().parent / "out"  # bench/out


def stub_yaml() -> None:
    """vocoder.flow.config subclasses yaml.SafeLoader at import time to read flow.yaml; this
    script never reads one, so on a torch+numpy machine a stand-in that refuses to load is
    enough."""
    try:
        import yaml  # noqa: F401
    except ImportError:
        stub = types.ModuleType("yaml")

        class SafeLoader:
            @classmethod
            def add_constructor(cls, tag: str, fn: Callable[..., Any]) -> None:
                del tag, fn

        def load(*_: Any, **__: Any) -> Any:
            raise RuntimeError("pyyaml is not installed (device_check stub)")

        stub.SafeLoader = SafeLoader  # type: ignore[attr-defined]
        stub.Node = stub.MappingNode = object  # type: ignore[attr-defined]
        stub.YAMLError = RuntimeError  # type: ignore[attr-defined]
        stub.load = load  # type: ignore[attr-defined]
        sys.modules["yaml"] = stub


stub_yaml()  # before the vocoder's modules are imported

from codeclog.vocoder.engine import Code2WavEngine  # noqa: E402
from codeclog.vocoder.flow import FlowConfig, Token2WavFlow  # noqa: E402
from codeclog.vocoder.hift.causal import (  # noqa: E402
    CausalHiftConfig,
    build_causal_hift,
    initialise_causal_hift,
)
from codeclog.vocoder.hift.causal_stream import CausalVocoder  # noqa: E402
from codeclog.vocoder.hift.config import HiftConfig  # noqa: E402
from codeclog.vocoder.hift.fixture_weights import initialise_hift  # noqa: E402
from codeclog.vocoder.hift.noncausal import build_hift  # noqa: E402
from codeclog.vocoder.hift.noncausal_stream import HiftCache, stream_step  # noqa: E402

SILENCE = 4218
WINDOW_IDS = 28
AUDIO_S_PER_WINDOW = 1.0
MEL_FRAMES_PER_WINDOW = 50


class OutOfTime(Exception):
    """The global time guard: the next section would start after the budget."""


@dataclasses.dataclass
class Check:
    args: argparse.Namespace
    device: torch.device
    deadline: float
    results: dict[str, Any] = dataclasses.field(default_factory=dict)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def guard(self, need_s: float = 0.0) -> None:
        if self.remaining() < need_s:
            raise OutOfTime

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def section(self, name: str, fn: Callable[[], Any]) -> None:
        started = time.monotonic()
        try:
            self.guard()
            self.results[name] = fn()
        except OutOfTime:
            self.results[name] = {"skipped": "global time guard"}
        except torch.cuda.OutOfMemoryError as exc:  # a figure in itself: record and go on
            self.results[name] = {"error": f"out of memory: {str(exc).splitlines()[0]}"}
            torch.cuda.empty_cache()
        self.results.setdefault("section_s", {})[name] = round(time.monotonic() - started, 2)
        write(self)  # partial results survive a kill


def ids_for(stream: int, windows: int) -> list[list[int]]:
    """`windows` canonical 25 + 3 windows of stream `stream` (3 silence ids first)."""
    total = [SILENCE] * 3 + [(i * 7919 + 13 * stream) % 6561 for i in range(25 * windows + 3)]
    return [total[25 * w : 25 * w + WINDOW_IDS] for w in range(windows)]


def configs(quick: bool) -> tuple[FlowConfig, HiftConfig, CausalHiftConfig]:
    if quick:
        return FlowConfig.tiny(), HiftConfig.tiny(), CausalHiftConfig.tiny()
    return FlowConfig.full(), HiftConfig.full(), CausalHiftConfig.full()


def build_engine(check: Check, device: str | torch.device) -> Code2WavEngine:
    flow_config, hift_config, _ = configs(check.args.quick)
    hift = build_hift(hift_config)
    initialise_hift(hift, 0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        flow = Token2WavFlow(flow_config)
    return Code2WavEngine(flow, hift, device=str(device), spec="device-check", kernels="native")


def rate_row(batch: int, windows: int, wall_s: float) -> dict[str, float]:
    audio = windows * AUDIO_S_PER_WINDOW
    return {
        "batch": batch,
        "windows": windows,
        "wall_s": round(wall_s, 4),
        "rtf_per_stream": round(wall_s / audio, 5),
        "windows_per_s": round(batch * windows / wall_s, 2),
        "audio_s_per_wall_s": round(batch * audio / wall_s, 2),
    }


def timed(check: Check, fn: Callable[[], Any]) -> float:
    check.sync()
    start = time.perf_counter()
    fn()
    check.sync()
    return time.perf_counter() - start


# -- sections -----------------------------------------------------------------------------


def engine_windows(engine: Code2WavEngine, states: list[Any], plans: list[Any], count: int) -> None:
    for position in range(1, count + 1):
        out = engine.decode_batch(
            [(states[i], plans[i][position], False) for i in range(len(states))]
        )
        states[:] = [state for _, state in out]


def engine_rates(check: Check, engine: Code2WavEngine) -> list[dict[str, Any]]:
    rows = []
    windows = check.args.windows
    for batch in check.args.batches:
        check.guard(check.args.section_reserve_s)
        states = [engine.setup(seed=i) for i in range(batch)]
        plans = [ids_for(i, windows + 1) for i in range(batch)]
        results = engine.decode_batch([(states[i], plans[i][0], False) for i in range(batch)])
        states = [state for _, state in results]  # warm-up window, untimed
        wall = timed(check, functools.partial(engine_windows, engine, states, plans, windows))
        rows.append(rate_row(batch, windows, wall))
        write(check)
    return rows


def first_window(check: Check, engine: Code2WavEngine) -> dict[str, Any]:
    times = []
    for attempt in range(3):
        state = engine.setup(seed=1000 + attempt)
        window = ids_for(1000 + attempt, 1)[0]
        times.append(timed(check, functools.partial(engine.decode_batch, [(state, window, False)])))
    return {
        "first_window_ms": [round(1000 * t, 2) for t in times],
        "best_ms": round(1000 * min(times), 2),
        "note": "a new stream's first window, three streams in turn (the first also warms up)",
    }


@contextlib.contextmanager
def counted(engine: Code2WavEngine) -> Iterator[dict[str, int]]:
    """Count flow and HiFT calls by wrapping their entry points (today's engine has no counter;
    the ragged-batching engine may add one, reported next to these counts)."""
    counts = {"flow_calls": 0, "hift_calls": 0}
    flow_call, hift_forward = engine.flow.decode_chunk_batch, engine.hift.forward

    def flow(*args: Any, **kwargs: Any) -> Any:
        counts["flow_calls"] += 1
        return flow_call(*args, **kwargs)

    def hift(*args: Any, **kwargs: Any) -> Any:
        counts["hift_calls"] += 1
        return hift_forward(*args, **kwargs)

    engine.flow.decode_chunk_batch = flow  # type: ignore[method-assign]
    engine.hift.forward = hift  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        del engine.flow.decode_chunk_batch
        del engine.hift.forward


def engine_counter(engine: Code2WavEngine) -> Any:
    for name in ("decode_calls_per_step", "last_step_calls", "calls_per_step"):
        value = getattr(engine, name, None)
        if value is not None:
            return value() if callable(value) else value
    return None


def mixed_positions(check: Check, engine: Code2WavEngine) -> dict[str, Any]:
    streams, positions = (8, 2) if check.args.quick else (16, 4)
    plans = [ids_for(i, positions + 1) for i in range(streams)]
    states = [engine.setup(seed=2000 + i) for i in range(streams)]
    for i in range(streams):  # stream i advanced to window i % positions
        for w in range(i % positions):
            states[i] = engine.decode_batch([(states[i], plans[i][w], False)])[0][1]
    items = [(states[i], plans[i][i % positions], False) for i in range(streams)]
    with counted(engine) as counts:
        wall = timed(check, lambda: engine.decode_batch(items))
    return {
        "streams": streams,
        "distinct_positions": positions,
        **counts,
        "engine_counter": engine_counter(engine),
        "wall_s": round(wall, 4),
        "note": "counts by wrapping flow.decode_chunk_batch and hift.forward",
    }


def memory(check: Check, engine: Code2WavEngine) -> dict[str, Any]:
    if check.device.type != "cuda":
        return {"skipped": "no CUDA device"}
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated(check.device)
    total = torch.cuda.get_device_properties(check.device).total_memory
    budget = (
        int(check.args.memory_budget_gib * 2**30)
        if check.args.memory_budget_gib
        else int(0.9 * total)
    )
    rows = []
    for batch in check.args.memory_batches:
        check.guard(check.args.section_reserve_s)
        torch.cuda.reset_peak_memory_stats(check.device)
        states = [engine.setup(seed=3000 + i) for i in range(batch)]
        plans = [ids_for(i, 2) for i in range(batch)]
        for position in range(2):
            out = engine.decode_batch(
                [(states[i], plans[i][position], False) for i in range(batch)]
            )
            states = [state for _, state in out]
        peak = torch.cuda.max_memory_allocated(check.device)
        per_stream = (peak - baseline) / batch
        held = sum(int(s.nbytes) for s in states) / batch
        rows.append(
            {
                "batch": batch,
                "peak_gib": round(peak / 2**30, 3),
                "per_stream_peak_mib": round(per_stream / 2**20, 1),
                "per_stream_state_mib": round(held / 2**20, 1),
                "streams_fit_by_peak": int((budget - baseline) // max(per_stream, 1)),
                "streams_fit_by_state": int((budget - baseline) // max(held, 1)),
            }
        )
        del states, out
        torch.cuda.empty_cache()
    return {
        "baseline_gib": round(baseline / 2**30, 3),
        "budget_gib": round(budget / 2**30, 2),
        "rows": rows,
    }


def pcm_digest(engine: Code2WavEngine, batch: int, seed: int) -> tuple[str, list[np.ndarray]]:
    states = [engine.setup(seed=seed + i) for i in range(batch)]
    plans = [ids_for(i, 2) for i in range(batch)]
    audio: list[np.ndarray] = []
    for position in range(2):
        out = engine.decode_batch(
            [(states[i], plans[i][position], position == 1) for i in range(batch)]
        )
        states = [state for _, state in out]
        audio += [samples for samples, _ in out]
    digest = hashlib.sha256(b"".join(a.astype(np.float32).tobytes() for a in audio))
    return digest.hexdigest(), audio


def determinism(check: Check, engine: Code2WavEngine) -> dict[str, Any]:
    first, _ = pcm_digest(engine, 4, 4000)
    second, _ = pcm_digest(engine, 4, 4000)
    return {"batch": 4, "identical": first == second, "sha256": [first[:16], second[:16]]}


def cpu_difference(check: Check, engine: Code2WavEngine) -> dict[str, Any]:
    if check.device.type == "cpu":
        return {"skipped": "already the CPU path"}
    check.guard(check.args.section_reserve_s)
    cpu = build_engine(check, "cpu")
    state = engine.setup(seed=5000)
    cpu_state = cpu.setup(seed=5000)
    window = ids_for(5000, 1)[0]
    gpu_audio = engine.decode_batch([(state, window, False)])[0][0]
    cpu_audio = cpu.decode_batch([(cpu_state, window, False)])[0][0]
    diff = np.abs(gpu_audio.astype(np.float64) - cpu_audio.astype(np.float64))
    return {
        "samples": int(diff.shape[0]),
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
        "rms_cpu": float(np.sqrt(np.mean(cpu_audio.astype(np.float64) ** 2))),
    }


def flow_rates(check: Check) -> list[dict[str, Any]]:
    flow_config, _, _ = configs(check.args.quick)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        flow = Token2WavFlow(flow_config).to(check.device).eval()
    flow.fill_buffers()
    generator = torch.Generator().manual_seed(0)
    prompt = 25
    tokens = torch.randint(0, flow_config.vocab_size, (prompt,), generator=generator)
    mel = torch.randn(
        prompt * flow_config.token_mel_ratio, flow_config.mel_dim, generator=generator
    )
    spk = torch.randn(flow_config.spk_embed_dim, generator=generator)
    with torch.inference_mode():
        base = flow.prepare_prompt(
            tokens.to(check.device), mel.to(check.device), spk.to(check.device)
        )
    rows = []
    for batch in check.args.batches:
        check.guard(check.args.section_reserve_s)
        ids = torch.tensor([ids_for(i, 1)[0] for i in range(batch)], device=check.device)
        with torch.inference_mode():
            _, states = flow.decode_chunk_batch([base] * batch, ids, False)  # warm-up
            run = functools.partial(flow_windows, flow, states, ids, check.args.windows)
            rows.append(rate_row(batch, check.args.windows, timed(check, run)))
        write(check)
    return rows


def flow_windows(flow: Token2WavFlow, states: list[Any], ids: torch.Tensor, count: int) -> None:
    for _ in range(count):
        _, states[:] = flow.decode_chunk_batch(states, ids, False)


def hift_a_windows(
    model: Any, caches: list[Any], mels: list[torch.Tensor], seeds: list[int]
) -> None:
    for mel in mels:
        caches[:] = stream_step(model, caches, mel, False, seeds).caches


def hift_b_windows(vocoder: CausalVocoder, caches: list[Any], mels: list[torch.Tensor]) -> None:
    for mel in mels:
        caches[:] = vocoder.step(caches, mel, False).caches


def hift_rates(check: Check, scheme: str) -> list[dict[str, Any]]:
    _, hift_config, causal_config = configs(check.args.quick)
    if scheme == "A":
        model = build_hift(hift_config)
        initialise_hift(model, 0)
        model = model.to(check.device).eval()
    else:
        causal = build_causal_hift(causal_config)
        initialise_causal_hift(causal, 0)
        vocoder = CausalVocoder(causal, device=check.device, batch_invariant=False)
    rows = []
    generator = torch.Generator().manual_seed(0)
    for batch in check.args.batches:
        check.guard(check.args.section_reserve_s)
        mels = [
            (torch.randn(batch, 80, MEL_FRAMES_PER_WINDOW, generator=generator) - 5.0).to(
                check.device
            )
            for _ in range(check.args.windows + 1)
        ]
        with torch.inference_mode():
            if scheme == "A":
                seeds = list(range(batch))
                empty = [HiftCache.empty(hift_config, check.device)] * batch
                caches = stream_step(model, empty, mels[0], False, seeds).caches
                run = functools.partial(hift_a_windows, model, caches, mels[1:], seeds)
            else:
                empty_b = [vocoder.empty_cache()] * batch
                caches_b = vocoder.step(empty_b, mels[0], False).caches
                run = functools.partial(hift_b_windows, vocoder, caches_b, mels[1:])
            rows.append(rate_row(batch, check.args.windows, timed(check, run)))
        write(check)
    return rows


# -- report -------------------------------------------------------------------------------


def write(check: Check) -> None:
    out = check.args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "device_check.json").write_text(
        json.dumps(check.results, indent=2, sort_keys=True) + "\n"
    )
    (out / "device_check.md").write_text(markdown(check.results))


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Device check ({results.get('device', '?')}, torch {results.get('torch', '?')})",
        "",
    ]
    lines.append("| part | batch | RTF / stream | windows/s | audio s / wall s |")
    lines.append("|---|---:|---:|---:|---:|")
    for part in ("flow", "hift_a", "hift_b", "engine"):
        rows = results.get(part)
        if not isinstance(rows, list):
            lines.append(f"| {part} | - | {json.dumps(rows)} | | |")
            continue
        for r in rows:
            lines.append(
                f"| {part} | {r['batch']} | {r['rtf_per_stream']:.4f} | {r['windows_per_s']:.1f} "
                f"| {r['audio_s_per_wall_s']:.1f} |"
            )
    lines.append("")
    for key in ("first_window", "mixed_positions", "memory", "determinism", "cpu_difference"):
        lines.append(f"- **{key}**: `{json.dumps(results.get(key))}`")
    lines += ["", f"Command: `{results.get('command', '')}`", ""]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, batches 1,2: seconds")
    parser.add_argument("--batches", default=None, help="comma list (default 1,4,16,64)")
    parser.add_argument("--windows", type=int, default=None, help="timed windows (default 3)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="global time guard (s)")
    parser.add_argument("--memory-budget-gib", type=float, default=None, help="default: 90%% GPU")
    parser.add_argument("--out", type=Path, default=None, help="default: $OUT, else bench/out")
    args = parser.parse_args(argv)
    default_batches = "1,2" if args.quick else "1,4,16,64"
    args.batches = [int(b) for b in (args.batches or default_batches).split(",") if b]
    args.memory_batches = args.batches[-2:]
    args.windows = args.windows or (1 if args.quick else 3)
    args.section_reserve_s = 0.0 if args.quick else 20.0
    args.out = args.out or Path(os.environ.get("OUT") or OUT_DIR)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if min(args.batches) < 1 or args.windows < 1:
        print("device_check: batch sizes and --windows must be >= 1", file=sys.stderr)
        return 2
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    check = Check(args, device, time.monotonic() + args.budget_s)
    check.results.update(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        sizes="tiny" if args.quick else "full (published), random weights",
        command="python -m bench.device_check " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    # the GPU box's CPU-path comparison uses up to 8 cores; --quick (a test) one, like the tests
    torch.set_num_threads(1 if args.quick else min(8, os.cpu_count() or 1))
    check.section("hift_a", lambda: hift_rates(check, "A"))
    check.section("hift_b", lambda: hift_rates(check, "B"))
    check.section("flow", lambda: flow_rates(check))
    engine = build_engine(check, device)
    check.section("first_window", lambda: first_window(check, engine))
    check.section("engine", lambda: engine_rates(check, engine))
    check.section("mixed_positions", lambda: mixed_positions(check, engine))
    check.section("determinism", lambda: determinism(check, engine))
    check.section("memory", lambda: memory(check, engine))
    check.section("cpu_difference", lambda: cpu_difference(check, engine))
    check.results["total_s"] = round(args.budget_s - check.remaining(), 1)
    write(check)
    print(markdown(check.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
