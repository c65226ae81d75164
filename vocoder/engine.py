"""The streaming Code2Wav engine: codec-id windows in, 24 kHz audio out, state explicit.

    engine = Code2WavEngine.from_spec("tiny")          # or a checkpoint directory
    state = engine.setup(seed=stream_seed(request_id, cache_epoch))
    [(audio, state)] = engine.decode_batch([(state, window_ids, final)])
    engine.release(state)

A request's whole streaming state is one frozen `StreamState` value (flow caches, HiFT caches,
seed, counters) that the caller owns; nothing per-request lives in the engine except the shared,
read-only per-voice prompt states. `decode_batch` never mutates its inputs: on any error the
caller still holds the old states.

Windows (MiniCPM-o's 25 + 3 rule): a non-final window of T ids yields mel for its first T - 3
ids; its last 3 ids are right context only and must open the next window again. A final window
yields mel for all its ids. "New frames" below are those codec frames: T - 3 (non-final) or T
(final); each is 2 mel frames, 960 samples.

Sample counts (scheme A HiFT, exact, tested): the engine holds back up to 3840 samples (160 ms,
8 mel frames) of every non-final window and cross-fades them with the next window. With H the
held samples before the window (0 for a new stream) and N = H + new_frames * 960:

- a non-final window emits N - min(3840, N) samples and then holds min(3840, N);
- a final window emits all N samples and holds nothing.

So the first non-final window of a stream emits new_frames * 960 - 3840 (20160 for a 28-id
window: 25 new frames), every later non-final window new_frames * 960 (24000 for 25), the final
window new_frames * 960 + 3840, and a whole stream exactly (sum of new frames) * 960 samples.
(A first non-final window of 7 ids or fewer emits nothing and holds all its N <= 3840 samples.)

Batching and exactness: `decode_batch` groups items by (window length, final, state signature)
and runs one flow call and one HiFT call per group (HiFT per row on CPU, see below). A
request's audio never depends on its batch mates: its HiFT noise comes from its own generator
(seeded by `window_seed(seed, window_index)`) and, with `batch_invariant` (the default on CPU),
the flow uses batch-invariant kernels and HiFT vocodes row by row, so a batched run gives every
request exactly the bytes of a solo run. That same exactness lets a CPU batch use several cores:
each group is cut into contiguous slices that `workers` threads decode side by side (flow and
HiFT of a slice in one thread, torch releases the GIL inside its kernels); any slicing gives the
same bytes. On
CUDA the default is a real batched HiFT call; results then depend on the batch composition (see
token2wav.md 4.4) and are reproducible for the same stack and batch membership only.

Failures: every item is validated before any compute (`WindowRejectedError`, a
`VocoderInputError` with the item index and a stable `reason`). The flow's own checks (prompt
plus cache over its table capacity: `flow_refused`) run when its group is reached, still before
that group computes. A runtime failure while a group computes (e.g. out of memory) raises out of
`decode_batch`; in every case no state is committed (states are values: the caller keeps the
old ones) and the caller may retry the items solo to isolate the one that fails. The engine
takes ownership of the modules it is given (moves, casts, fuses them) and is not thread-safe.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import itertools
import json
import struct
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from codeclog.cores import one_per_core
from codeclog.vocoder.checkpoint import inspect_checkpoint, load_checkpoint, load_fixture
from codeclog.vocoder.determinism import (
    DeterminismSettings,
    apply_determinism,
    stream_seed,
    window_seed,
)
from codeclog.vocoder.domain import determinism_domain
from codeclog.vocoder.errors import StreamStateError, VocoderConfigError, VocoderInputError
from codeclog.vocoder.flow import FlowState, FlowStateError, Token2WavFlow
from codeclog.vocoder.hift import HiftCache, HiFTGenerator, fuse_weight_norm, stream_step
from codeclog.vocoder.kernels import Kernels, kernel_scope
from codeclog.vocoder.shared import pcm_s16le
from codeclog.vocoder.voice import Voice, default_voice

__all__ = [
    "Code2WavEngine",
    "StreamState",
    "StreamStateError",
    "VocoderInputError",
    "Voice",
    "WindowRejectReason",
    "WindowRejectedError",
    "default_voice",
    "pcm_s16le",
    "stream_seed",
]

SAMPLE_RATE_HZ = 24000
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_CPU_WORKERS = 4  # decode workers by default on CPU (see default_workers)
PROMPT_CACHE_SIZE = 8  # voices whose prompt state is kept (each is ~1 MB per prompt frame, full)


class WindowRejectReason(enum.Enum):
    """Why the engine refused an item. Stable values: they go to dead letters and metrics."""

    EMPTY_WINDOW = "empty_window"
    TOKEN_OUT_OF_RANGE = "token_out_of_range"
    CHUNK_BELOW_LOOKAHEAD_WINDOW = "chunk_below_lookahead_window"
    STREAM_FINISHED = "stream_finished"
    FOREIGN_STATE = "foreign_state"  # not a StreamState of an engine of these sizes
    FLOW_REFUSED = "flow_refused"  # the flow's own checks (e.g. prompt + cache over capacity)


class WindowRejectedError(VocoderInputError):
    """An item of a decode_batch call is refused; no state changed.

    item_index: the first refused item; item_indices: every item refused for the same cause
    (several only for FLOW_REFUSED, which refuses a whole group of equal-shape items).
    """

    def __init__(
        self,
        item_index: int,
        reason: WindowRejectReason,
        message: str,
        item_indices: tuple[int, ...] = (),
    ) -> None:
        super().__init__(f"item {item_index}: {reason.value}: {message}")
        self.item_index = item_index
        self.item_indices = item_indices or (item_index,)
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# Per-request state

_MAGIC = b"CCSTREAM"
_FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHII")  # magic, version, JSON header length, flow blob length
_HIFT_FIELDS = ("hift_mel", "hift_source", "hift_speech")


@dataclasses.dataclass(frozen=True, eq=False)
class StreamState:
    """Everything one (request, epoch) stream carries from a window to the next."""

    flow: FlowState  # flow caches (conformer + DiT), speaker vector, prompt length
    hift_mel: Tensor  # (80, M<=8) mel frames re-vocoded with the next window
    hift_source: Tensor  # (M*480,) NSF excitation of those frames
    hift_speech: Tensor  # (M*480,) held-back samples, cross-faded with the next window
    seed: int  # the stream seed (see stream_seed); HiFT noise derives from it per window
    window_index: int  # windows decoded so far
    samples_emitted: int  # samples returned so far (the sample offset of the next audio)
    voice_id: str  # the voice whose prompt state the stream started from

    @property
    def finished(self) -> bool:
        """The final window was decoded; the stream cannot continue."""
        return bool(self.flow.finished)

    @property
    def held_samples(self) -> int:
        return int(self.hift_speech.shape[0])

    @property
    def nbytes(self) -> int:
        hift = sum(int(getattr(self, name).nbytes) for name in _HIFT_FIELDS)
        return int(self.flow.nbytes) + hift

    def hift_cache(self) -> HiftCache:
        return HiftCache(self.hift_mel, self.hift_source, self.hift_speech)

    def signature(self) -> Hashable:
        """States with equal signatures (and equal windows) run in one batch."""
        return (self.flow.shape_signature(), self.hift_cache().signature())

    def to(self, device: torch.device | str) -> StreamState:
        moved = {name: getattr(self, name).to(device) for name in _HIFT_FIELDS}
        return dataclasses.replace(self, flow=self.flow.to(device), **moved)

    def to_bytes(self) -> bytes:
        """Exact, self-describing bytes: header, HiFT tensors, then FlowState.to_bytes()."""
        blobs = [_raw(getattr(self, name)) for name in _HIFT_FIELDS]
        header = {
            "seed": self.seed,
            "window_index": self.window_index,
            "samples_emitted": self.samples_emitted,
            "voice_id": self.voice_id,
            "tensors": [
                _spec(getattr(self, n), len(b)) for n, b in zip(_HIFT_FIELDS, blobs, strict=True)
            ],
        }
        encoded = json.dumps(header, sort_keys=True).encode()
        flow = self.flow.to_bytes()
        head = _HEADER.pack(_MAGIC, _FORMAT_VERSION, len(encoded), len(flow))
        return b"".join([head, encoded, *blobs, flow])

    @classmethod
    def from_bytes(cls, data: bytes) -> StreamState:
        """The inverse of to_bytes; tensors land on the CPU (the engine moves them).
        Raises StreamStateError for bytes that are not an intact stream state."""
        try:
            return cls._parse(data)
        except (KeyError, TypeError, ValueError, RuntimeError, struct.error) as exc:
            raise StreamStateError(f"stream state bytes are corrupt: {exc}") from exc
        except FlowStateError as exc:
            raise StreamStateError(f"stream state bytes: {exc}") from exc

    @classmethod
    def _parse(cls, data: bytes) -> StreamState:
        magic, version, header_len, flow_len = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != _FORMAT_VERSION:
            raise StreamStateError("stream state bytes: not a codeclog stream state v1")
        start = _HEADER.size
        header = json.loads(data[start : start + header_len])
        position = start + header_len
        tensors: dict[str, Tensor] = {}
        for name, spec in zip(_HIFT_FIELDS, header["tensors"], strict=True):
            size = int(spec["nbytes"])
            tensors[name] = _unraw(data[position : position + size], spec)
            position += size
        if len(data) - position != flow_len:
            raise StreamStateError("stream state bytes: truncated")
        return cls(
            flow=FlowState.from_bytes(data[position:]),
            seed=int(header["seed"]),
            window_index=int(header["window_index"]),
            samples_emitted=int(header["samples_emitted"]),
            voice_id=str(header["voice_id"]),
            **tensors,
        )


def _raw(tensor: Tensor) -> bytes:
    if tensor.numel() == 0:  # an empty view may carry stride 0, which .view(uint8) refuses
        return b""
    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _spec(tensor: Tensor, nbytes: int) -> dict[str, object]:
    dtype = str(tensor.dtype).removeprefix("torch.")
    return {"dtype": dtype, "shape": list(tensor.shape), "nbytes": nbytes}


def _unraw(blob: bytes, spec: dict[str, object]) -> Tensor:
    dtype = getattr(torch, str(spec["dtype"]), None)
    if not isinstance(dtype, torch.dtype) or len(blob) != int(str(spec["nbytes"])):
        raise StreamStateError("stream state bytes: corrupt tensor table")
    shape = [int(n) for n in spec["shape"]]  # type: ignore[attr-defined]
    raw = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0)
    return raw.to(torch.uint8).view(dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------
# The engine

DecodeItem = tuple[StreamState, Sequence[int], bool]


@dataclasses.dataclass(frozen=True)
class _Window:
    """One validated item: its position in the call, its state on the device, its ids."""

    index: int
    state: StreamState
    ids: tuple[int, ...]
    final: bool


class Code2WavEngine:
    """Token2wav flow + HiFT (scheme A) with explicit per-request state. See the module doc."""

    sample_rate_hz: int = SAMPLE_RATE_HZ

    def __init__(
        self,
        flow: Token2WavFlow,
        hift: HiFTGenerator,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        batch_invariant: bool | None = None,
        threads: int | None = None,
        workers: int | None = None,
        voice: Voice | None = None,
        spec: str = "custom",
        kernels: str | Kernels | None = None,
    ) -> None:
        if dtype not in DTYPES:
            raise VocoderConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.device = torch.device(device)
        self.kernels = default_kernels(self.device) if kernels is None else Kernels.parse(kernels)
        if self.kernels is Kernels.PORTABLE and self.device.type != "cpu":
            raise VocoderConfigError("portable kernels run on the CPU only (use --kernels native)")
        self.dtype = dtype
        self.spec = spec
        self.determinism: DeterminismSettings = apply_determinism(self.device, threads)
        self.batch_invariant = (
            self.device.type == "cpu" if batch_invariant is None else bool(batch_invariant)
        )
        self.workers = default_workers(self.device) if workers is None else workers
        if self.workers < 1:
            raise VocoderConfigError(f"workers must be >= 1, got {self.workers}")
        self._pool: ThreadPoolExecutor | None = None
        # HiFT stays float32 whatever `dtype` says (upstream's float16 flag casts only the flow)
        fuse_weight_norm(hift)
        self.hift = hift.to(self.device).eval()
        self.flow = flow.to(device=self.device, dtype=DTYPES[dtype]).eval()
        self.flow_config = flow.config
        self.hift_config = hift.config
        with self.scope():  # constant tables and the default voice's noise: the engine's kernels
            self.flow.fill_buffers()
            self.default_voice = voice if voice is not None else default_voice(flow.config)
        self.domain = determinism_domain(self.device, self.kernels, self.determinism)
        self._prompts: collections.OrderedDict[tuple[str, str], FlowState] = (
            collections.OrderedDict()
        )
        self.prompt_setups = 0  # prepare_prompt runs so far (the prompt cache's misses)

    def scope(self) -> contextlib.AbstractContextManager[None]:
        """The engine's kernels for the calling thread (see vocoder.kernels)."""
        return kernel_scope(self.kernels)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_spec(
        cls,
        spec: str,
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
        workers: int | None = None,
        kernels: str | Kernels | None = None,
    ) -> Code2WavEngine:
        """Spec "tiny" = the committed tiny fixture; anything else = a checkpoint directory."""
        options = {"device": device, "dtype": dtype, "threads": threads, "workers": workers}
        if spec == "tiny":
            return cls.tiny(**options, kernels=kernels)  # type: ignore[arg-type]
        return cls.load(spec, **options, kernels=kernels)  # type: ignore[arg-type]

    @classmethod
    def tiny(
        cls,
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
        workers: int | None = None,
        kernels: str | Kernels | None = None,
    ) -> Code2WavEngine:
        flow, hift = load_fixture()
        return cls(
            flow,
            hift,
            device=device,
            dtype=dtype,
            threads=threads,
            workers=workers,
            spec="tiny",
            kernels=kernels,
        )

    @classmethod
    def load(
        cls,
        checkpoint_dir: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        threads: int | None = None,
        workers: int | None = None,
        kernels: str | Kernels | None = None,
    ) -> Code2WavEngine:
        """A published checkpoint directory (flow.yaml, flow.pt, hift.pt; see checkpoint.py).
        Streams use the default voice (prompt extraction from ONNX models is not built)."""
        layout = inspect_checkpoint(checkpoint_dir)
        flow, hift = load_checkpoint(layout)
        spec = str(layout.directory)
        return cls(
            flow,
            hift,
            device=device,
            dtype=dtype,
            threads=threads,
            workers=workers,
            spec=spec,
            kernels=kernels,
        )

    def describe(self) -> dict[str, object]:
        """What this engine is, for logs and run records."""
        return {
            "spec": self.spec,
            "device": str(self.device),
            "dtype": self.dtype,
            "batch_invariant": self.batch_invariant,
            "workers": self.workers,
            "sample_rate_hz": self.sample_rate_hz,
            "determinism": self.determinism.to_dict(),
            "kernels": self.kernels.value,
            "domain": self.domain,
            "torch": torch.__version__,
        }

    # -- streams -----------------------------------------------------------------------------

    def setup(self, voice: Voice | None = None, seed: int = 0) -> StreamState:
        """A new stream for `voice` (default: the engine's default voice). `seed` should be
        stream_seed(request_id, cache_epoch) so a replay of the stream draws the same noise."""
        chosen = self.default_voice if voice is None else voice
        empty = HiftCache.empty(self.hift_config, self.device)
        return StreamState(
            flow=self._prompt_state(chosen),
            hift_mel=empty.mel,
            hift_source=empty.source,
            hift_speech=empty.speech,
            seed=int(seed),
            window_index=0,
            samples_emitted=0,
            voice_id=chosen.voice_id,
        )

    def _prompt_state(self, voice: Voice) -> FlowState:
        key = (voice.voice_id, voice.fingerprint)
        cached = self._prompts.get(key)
        if cached is not None:
            self._prompts.move_to_end(key)
            return cached
        voice.check(self.flow_config)
        with self.scope():
            state = self.flow.prepare_prompt(
                voice.prompt_tokens, voice.prompt_mel, voice.spk_embedding
            )
        self.prompt_setups += 1
        self._prompts[key] = state
        while len(self._prompts) > PROMPT_CACHE_SIZE:
            self._prompts.popitem(last=False)
        return state

    def release(self, state: StreamState) -> None:
        """The stream is over. A StreamState owns its tensors (the shared prompt state is
        read-only and cached per voice), so there is nothing to free here beyond dropping the
        reference; the call marks the end of a stream in the interface, for engines that pool
        per-stream memory."""
        if not isinstance(state, StreamState):
            raise VocoderInputError("release() takes a StreamState")

    # -- decoding ----------------------------------------------------------------------------

    def decode_batch(self, items: Sequence[DecodeItem]) -> list[tuple[np.ndarray, StreamState]]:
        """Decode one window per item; returns (float32 mono 24 kHz audio, new state) per item,
        in order. Every item is validated first (WindowRejectedError names the first bad one);
        see the module doc for grouping, exactness and the sample-count rules."""
        windows = [self._validate(index, item) for index, item in enumerate(items)]
        results: list[tuple[np.ndarray, StreamState] | None] = [None] * len(windows)
        for group in self._groups(windows):
            for window, result in zip(group, self._decode_group(group), strict=True):
                results[window.index] = result
        return [result for result in results if result is not None]

    def _validate(self, index: int, item: DecodeItem) -> _Window:
        state, ids, final = item
        if not isinstance(state, StreamState):
            raise WindowRejectedError(index, WindowRejectReason.FOREIGN_STATE, "not a StreamState")
        if state.finished:
            raise WindowRejectedError(
                index, WindowRejectReason.STREAM_FINISHED, "the stream already ended"
            )
        window = tuple(int(i) for i in ids)
        self._check_ids(index, window, bool(final))
        if state.flow.spk.shape != (self.flow_config.mel_dim,) or state.hift_mel.shape[0] != (
            self.hift_config.in_channels
        ):
            raise WindowRejectedError(
                index, WindowRejectReason.FOREIGN_STATE, "state from an engine of other sizes"
            )
        return _Window(index, self._on_device(state), window, bool(final))

    def _check_ids(self, index: int, window: tuple[int, ...], final: bool) -> None:
        if not window:
            raise WindowRejectedError(index, WindowRejectReason.EMPTY_WINDOW, "no codec ids")
        vocab = self.flow_config.vocab_size
        if min(window) < 0 or max(window) >= vocab:
            raise WindowRejectedError(
                index, WindowRejectReason.TOKEN_OUT_OF_RANGE, f"codec ids must be in 0..{vocab - 1}"
            )
        lookahead = self.flow_config.pre_lookahead_len
        if not final and len(window) <= lookahead:
            raise WindowRejectedError(
                index,
                WindowRejectReason.CHUNK_BELOW_LOOKAHEAD_WINDOW,
                f"a non-final window needs at least {lookahead + 1} ids, got {len(window)}",
            )

    def _on_device(self, state: StreamState) -> StreamState:
        if state.hift_mel.device == self.device and state.flow.spk.device == self.device:
            return state
        return state.to(self.device)

    @staticmethod
    def _groups(windows: Sequence[_Window]) -> list[list[_Window]]:
        groups: dict[Hashable, list[_Window]] = {}
        for window in windows:
            key = (len(window.ids), window.final, window.state.signature())
            groups.setdefault(key, []).append(window)
        return list(groups.values())

    def _decode_group(self, group: Sequence[_Window]) -> list[tuple[np.ndarray, StreamState]]:
        """One group, split into contiguous slices decoded side by side by the workers when the
        decode is batch-invariant (then a slice's rows get exactly the bytes of the whole
        group's: this is how a CPU batch uses more than one core without losing exactness)."""
        slices = _split(group, self.workers if self.batch_invariant else 1)
        if len(slices) == 1:
            return self._decode_slice(group, group)
        futures = [self._workers().submit(self._decode_slice, group, part) for part in slices]
        return [result for future in futures for result in future.result()]

    def _workers(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="code2wav")
        return self._pool

    def _decode_slice(
        self, group: Sequence[_Window], part: Sequence[_Window]
    ) -> list[tuple[np.ndarray, StreamState]]:
        with self.scope(), torch.inference_mode():  # per thread: the workers enter them too
            return self._decode_slice_in_scope(group, part)

    def _decode_slice_in_scope(
        self, group: Sequence[_Window], part: Sequence[_Window]
    ) -> list[tuple[np.ndarray, StreamState]]:
        final = part[0].final
        tokens = torch.tensor([w.ids for w in part], dtype=torch.long, device=self.device)
        try:
            mel, flow_states = self.flow.decode_chunk_batch(
                [w.state.flow for w in part], tokens, final
            )
        except VocoderInputError as exc:  # the flow checks before computing anything
            indices = tuple(w.index for w in group)  # equal shapes: the whole group is refused
            raise WindowRejectedError(
                indices[0], WindowRejectReason.FLOW_REFUSED, str(exc), indices
            ) from exc
        mel = mel.to(torch.float32)
        seeds = [window_seed(w.state.seed, w.state.window_index) for w in part]
        caches = [w.state.hift_cache() for w in part]
        audio, new_caches = self._vocode(caches, mel, final, seeds)
        return [
            _advance(w.state, flow_state, cache, samples)
            for w, flow_state, cache, samples in zip(
                part, flow_states, new_caches, audio, strict=True
            )
        ]

    def _vocode(
        self, caches: list[HiftCache], mel: Tensor, final: bool, seeds: list[int]
    ) -> tuple[list[np.ndarray], list[HiftCache]]:
        if self.batch_invariant:
            steps = [
                stream_step(self.hift, [cache], mel[row : row + 1], final, [seed])
                for row, (cache, seed) in enumerate(zip(caches, seeds, strict=True))
            ]
            audio = [step.audio[0] for step in steps]
            new_caches = [step.caches[0] for step in steps]
        else:
            step = stream_step(self.hift, caches, mel, final, seeds)
            audio, new_caches = step.audio, step.caches
        return [a.to("cpu").numpy().astype(np.float32, copy=False) for a in audio], new_caches


def default_kernels(device: torch.device) -> Kernels:
    """Native: the portable kernels cost more than 2x the native RTF on CPU (BENCHMARKS.md,
    "Determinism"), so they are chosen explicitly (`--kernels portable`, and replay's and
    verify's defaults); on an accelerator only native kernels exist."""
    del device
    return Kernels.NATIVE


def default_workers(device: torch.device) -> int:
    """Decode workers: on CPU one per core up to 4 (each runs its slice with the engine's
    intra-op thread count, 1 by default); on an accelerator 1 (the device batches)."""
    if device.type != "cpu":
        return 1
    return one_per_core(MAX_CPU_WORKERS)


def _split(items: Sequence[_Window], parts: int) -> list[Sequence[_Window]]:
    """`items` in at most `parts` contiguous slices of near-equal size (order kept)."""
    count = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), count)
    bounds = [0]
    for index in range(count):
        bounds.append(bounds[-1] + size + (1 if index < extra else 0))
    return [items[start:end] for start, end in itertools.pairwise(bounds)]


def _advance(
    state: StreamState, flow: FlowState, cache: HiftCache, audio: np.ndarray
) -> tuple[np.ndarray, StreamState]:
    if flow.finished:  # nothing is held after the final window: drop the tails
        cache = HiftCache(cache.mel[:, :0], cache.source[:0], cache.speech[:0])
    new_state = dataclasses.replace(
        state,
        flow=flow,
        hift_mel=cache.mel,
        hift_source=cache.source,
        hift_speech=cache.speech,
        window_index=state.window_index + 1,
        samples_emitted=state.samples_emitted + int(audio.shape[0]),
    )
    return audio, new_state
