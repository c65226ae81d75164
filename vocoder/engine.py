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

The causal HiFT (scheme B, `hift="causal"`, docs/vocoder.md "Scheme B"): the engine vocodes with
`vocoder.causal_hift.CausalVocoder` instead; the StreamState then holds its bounded history (a
`CausalHiftCache`) and nothing is cross-faded. Sample counts follow `causal_hift.emitted_samples`
over the window's new mel frames (2 per new codec frame): a fixed delay of 8 mel frames (3840
samples), so the first non-final window of a stream emits new_frames * 960 (the 3840 zeros of
upstream's lead-in, then new_frames * 960 - 3840 samples), every later non-final window
new_frames * 960 and the final window new_frames * 960 + 3840: a whole stream emits
(sum of new frames) * 960 + 3840 samples (sum * 960 when its only window is final). A state of
one variant is refused by an engine of the other (`FOREIGN_STATE`), the variant is part of the
state signature and of the determinism domain (":causal"), and ragged batching is refused.

Batching and exactness: `decode_batch` groups items by (window length, final, state signature) and
runs one flow call and one HiFT call per group (HiFT per row on CPU, see below). A request's audio
never depends on its batch mates: its HiFT noise comes from its own generator (seeded by
`window_seed(seed, window_index)`) and, with `batch_invariant` (the default on CPU), the flow uses
batch-invariant kernels with one GEMM per request row (`per_row_gemms`: the shapes a CPU kernel sees
never depend on the batch) and HiFT vocodes row by row, so a batched run gives every request exactly
the bytes of a solo run. That same exactness lets a CPU batch use several cores: each group is cut
into contiguous slices that `workers` threads decode side by side (flow and HiFT of a slice in one
thread, torch releases the GIL inside its kernels); any slicing gives the same bytes. On CUDA the
default is a real batched HiFT call; results then depend on the batch composition (see token2wav.md
4.4) and are reproducible for the same stack and batch membership only.

Ragged batching (`batching="ragged"`, opt-in; docs/vocoder.md "Ragged batching"): every
window of the call in one flow call and one HiFT call per final flag (and per decode worker on
the CPU, each taking a slice), padded and masked (vocoder.flow.ragged, vocoder.hift_ragged);
each row within a measured bound of its solo decode, not bytewise, so the determinism domain
carries ":ragged", and its GEMMs take the whole batch (no per-row GEMMs: the rows' bytes depend
on their mates anyway). `engine.calls` counts flow and HiFT calls
(vocoder.mixed_batch.decode_calls gives one step's count).

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
import concurrent.futures
import contextlib
import dataclasses
import enum
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

import numpy as np
import torch
from torch import Tensor

from codeclog.cores import one_per_core
from codeclog.vocoder.causal_hift import CausalHiFTGenerator
from codeclog.vocoder.causal_stream import CausalHiftCache, CausalVocoder
from codeclog.vocoder.checkpoint import (
    HiftVariant,
    choose_hift_variant,
    inspect_checkpoint,
    load_causal_fixture,
    load_causal_hift,
    load_checkpoint,
    load_fixture,
)
from codeclog.vocoder.determinism import (
    DeterminismSettings,
    apply_determinism,
    stream_seed,
    window_seed,
)
from codeclog.vocoder.domain import determinism_domain, engine_domain_suffix
from codeclog.vocoder.errors import VocoderConfigError, VocoderInputError
from codeclog.vocoder.flow import FlowState, Token2WavFlow
from codeclog.vocoder.flow.parallel import RowThreads, row_parts
from codeclog.vocoder.flow.ragged import decode_ragged
from codeclog.vocoder.flow.stable import per_row_gemms
from codeclog.vocoder.hift import HiFTGenerator
from codeclog.vocoder.hift_config import HiftConfig
from codeclog.vocoder.hift_layers import fuse_weight_norm
from codeclog.vocoder.hift_stream import HiftCache, stream_step, stream_step_ragged
from codeclog.vocoder.kernels import Kernels, kernel_scope
from codeclog.vocoder.shared import pcm_s16le
from codeclog.vocoder.stream_state import HiftState, StreamState

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11 on
from codeclog.vocoder.voice import Voice, default_voice

__all__ = [
    "Code2WavEngine",
    "VocoderInputError",
    "Voice",
    "WindowRejectReason",
    "WindowRejectedError",
    "default_voice",
    "pcm_s16le",
    "stream_seed",
]

SAMPLE_RATE_HZ = 24000
T = TypeVar("T")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# exact: equal-shape groups, every row byte-identical to its solo decode (the default);
# ragged: one flow and one HiFT call per final flag, rows within a measured bound of solo
BATCHING = ("exact", "ragged")
MAX_CPU_WORKERS = 4  # decode workers by default on CPU (see default_workers)
PROMPT_CACHE_SIZE = 8  # voices whose prompt state is kept (each is ~1 MB per prompt frame, full)
# The open-stream state budget (consumers.stream.limit): on CUDA this share of the device memory
# free after the weights loaded (the rest is a decode batch's working memory and the allocator's
# slack); on the CPU a constant (about 40 full-size streams of 195.9 MB, or ~800k tiny ones).
CUDA_STATE_BUDGET_SHARE = 0.6
CPU_STATE_BUDGET_BYTES = 8 * 1024**3


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
# The engine

DecodeItem = tuple[StreamState, Sequence[int], bool]


class EngineOptions(TypedDict, total=False):
    """The keywords of Code2WavEngine and of its constructors from_spec, tiny and load (which
    also take `hift`, the variant to load), every one optional."""

    device: str  # "cpu" (the default), "cuda", ...
    dtype: str  # the flow's: "float32" (the default), "bfloat16", "float16" (CUDA only)
    batch_invariant: bool | None  # None: on the CPU (rows byte-identical to solo decodes)
    threads: int | None  # intra-op threads (vocoder.determinism); None: its default
    workers: int | None  # decode workers; None: `default_workers`
    voice: Voice | None  # the default voice; None: `vocoder.voice.default_voice`
    kernels: str | Kernels | None  # "native" or "portable"; None: `default_kernels`
    batching: str  # "exact" (the default) or "ragged"


@dataclasses.dataclass
class DecodeCalls:
    """Model calls an engine made: `flow` (conformer + CFM solve) and `hift` (vocoder)."""

    flow: int = 0
    hift: int = 0

    def since(self, before: DecodeCalls) -> DecodeCalls:
        return DecodeCalls(self.flow - before.flow, self.hift - before.hift)

    def copy(self) -> DecodeCalls:
        return DecodeCalls(self.flow, self.hift)


@dataclasses.dataclass(frozen=True)
class _Window:
    """One validated item: its position in the call, its state on the device, its ids."""

    index: int
    state: StreamState
    ids: tuple[int, ...]
    final: bool


class Code2WavEngine:
    """Token2wav flow + HiFT (scheme A, or the causal HiFT of scheme B when `hift` is a
    CausalHiFTGenerator) with explicit per-request state. See the module doc."""

    sample_rate_hz: int = SAMPLE_RATE_HZ

    def __init__(
        self,
        flow: Token2WavFlow,
        hift: HiFTGenerator | CausalHiFTGenerator,
        *,
        spec: str = "custom",
        **options: Unpack[EngineOptions],
    ) -> None:
        dtype, batching = options.get("dtype", "float32"), options.get("batching", "exact")
        if dtype not in DTYPES:
            raise VocoderConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if batching not in BATCHING:
            raise VocoderConfigError(
                f"batching must be one of {', '.join(BATCHING)}, got {batching!r}"
            )
        causal = isinstance(hift, CausalHiFTGenerator)
        if causal and batching == "ragged":
            raise VocoderConfigError(
                "the causal HiFT cannot batch ragged (vocoder.hift_ragged is scheme A only): "
                "use batching exact"
            )
        self.hift_variant = HiftVariant.CAUSAL if causal else HiftVariant.NONCAUSAL
        self.batching = batching
        self.calls = DecodeCalls()  # flow and HiFT calls so far (a step's count: the delta)
        self.device = torch.device(options.get("device", "cpu"))
        kernels = options.get("kernels")
        self.kernels = default_kernels(self.device) if kernels is None else Kernels.parse(kernels)
        if self.kernels is Kernels.PORTABLE and self.device.type != "cpu":
            raise VocoderConfigError("portable kernels run on the CPU only (use --kernels native)")
        if self.kernels is Kernels.PORTABLE and batching == "ragged":
            # the ragged path's row masks need ops the portable kernels do not define (&)
            raise VocoderConfigError(
                "ragged batching runs with native kernels only (its rows are within a bound of "
                "their solo decode, never portable bytes): use --kernels native"
            )
        if dtype == "float16" and self.device.type == "cpu":
            raise VocoderConfigError(half_precision_refusal())
        self.dtype = dtype
        self.spec = spec
        self.determinism: DeterminismSettings = apply_determinism(
            self.device, options.get("threads")
        )
        batch_invariant = options.get("batch_invariant")
        self.batch_invariant = (
            self.device.type == "cpu" if batch_invariant is None else bool(batch_invariant)
        )
        workers = options.get("workers")
        self.workers = default_workers(self.device) if workers is None else workers
        if self.workers < 1:
            raise VocoderConfigError(f"workers must be >= 1, got {self.workers}")
        self._pool: ThreadPoolExecutor | None = None
        # HiFT stays float32 whatever `dtype` says (upstream's float16 flag casts only the flow)
        self.causal: CausalVocoder | None = None
        if isinstance(hift, CausalHiFTGenerator):  # fuses, F0 predictor in float64, noise table
            self.causal = CausalVocoder(
                hift, device=self.device, batch_invariant=self.batch_invariant
            )
        else:
            fuse_weight_norm(hift)
        self.hift = hift.to(self.device).eval()
        self.flow = flow.to(device=self.device, dtype=DTYPES[dtype]).eval()
        self.flow_config = flow.config
        self.hift_config: HiftConfig = hift.config  # a CausalHiftConfig extends it
        voice = options.get("voice")
        with self.scope():  # constant tables and the default voice's noise: the engine's kernels
            self.flow.fill_buffers()
            self.default_voice = voice if voice is not None else default_voice(flow.config)
        self.domain = determinism_domain(self.device, self.kernels, self.determinism)
        self.domain += engine_domain_suffix(dtype, self.hift_variant.value, batching)
        self._prompts: collections.OrderedDict[tuple[str, str], FlowState] = (
            collections.OrderedDict()
        )
        self.prompt_setups = 0  # prepare_prompt runs so far (the prompt cache's misses)
        self.free_bytes_at_start = _free_device_bytes(self.device)

    @property
    def lookahead_frames(self) -> int:
        """Right-context ids a non-final window carries (the flow's pre_lookahead_len); the
        fold's FoldConfig.lookahead_frames must equal it (consumers.stream.pipeline checks)."""
        return int(self.flow_config.pre_lookahead_len)

    @property
    def vocab_size(self) -> int:
        """Codec ids this engine accepts are 0 .. vocab_size - 1."""
        return int(self.flow_config.vocab_size)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """The engine's kernels for the calling thread (see vocoder.kernels) and, when it is
        batch-invariant with exact batching, one GEMM per request row (vocoder.flow.stable
        .per_row_gemms). Ragged rows are within a bound of their solo decode, not its bytes,
        whatever their GEMMs: a ragged engine's take the whole batch, as a GPU's do."""
        exact_rows = self.batch_invariant and self.batching == "exact"
        rows = per_row_gemms() if exact_rows else contextlib.nullcontext()
        with kernel_scope(self.kernels), rows:
            yield

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_spec(
        cls, spec: str, *, hift: str | HiftVariant = "noncausal", **options: Unpack[EngineOptions]
    ) -> Code2WavEngine:
        """Spec "tiny" = the committed tiny fixture; anything else = a checkpoint directory.
        `hift`: "noncausal" (scheme A, the default) or "causal" (scheme B)."""
        if spec == "tiny":
            return cls.tiny(hift=hift, **options)
        return cls.load(spec, hift=hift, **options)

    @classmethod
    def tiny(
        cls, *, hift: str | HiftVariant = "noncausal", **options: Unpack[EngineOptions]
    ) -> Code2WavEngine:
        """The tiny fixture; its causal HiFT (hift="causal") is `load_causal_fixture`'s."""
        flow, noncausal = load_fixture()
        causal = HiftVariant.parse(hift) is HiftVariant.CAUSAL
        return cls(flow, load_causal_fixture() if causal else noncausal, spec="tiny", **options)

    @classmethod
    def load(
        cls,
        checkpoint_dir: str | Path,
        *,
        hift: str | HiftVariant = "noncausal",
        **options: Unpack[EngineOptions],
    ) -> Code2WavEngine:
        """A published checkpoint directory (flow.yaml, flow.pt, hift.pt; see checkpoint.py).
        Streams use the default voice (prompt extraction from ONNX models is not built).
        hift="causal" needs the minicpmo-utils 1.0.7 layout (`choose_hift_variant`)."""
        layout = inspect_checkpoint(checkpoint_dir)
        variant = choose_hift_variant(layout, hift)
        flow, noncausal = load_checkpoint(layout)
        vocoder = load_causal_hift(layout) if variant is HiftVariant.CAUSAL else noncausal
        return cls(flow, vocoder, spec=str(layout.directory), **options)

    def describe(self) -> dict[str, object]:
        """What this engine is, for logs and run records."""
        return {
            "spec": self.spec,
            "device": str(self.device),
            "dtype": self.dtype,
            "batch_invariant": self.batch_invariant,
            "batching": self.batching,
            "hift": self.hift_variant.value,
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
        empty: HiftState = (
            self.causal.empty_cache()
            if self.causal is not None
            else HiftCache.empty(self.hift_config, self.device)
        )
        return StreamState(
            flow=self._prompt_state(chosen),
            hift=empty,
            seed=int(seed),
            window_index=0,
            samples_emitted=0,
            voice_id=chosen.voice_id,
        )

    def _scheme_a_hift(self) -> HiFTGenerator:
        assert isinstance(self.hift, HiFTGenerator)
        return self.hift

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

    def peak_state_bytes(self, voice: Voice | None = None) -> int:
        """The most bytes one stream's state of `voice` ever holds between windows: both
        attention caches at prompt + att_keep_frames frames (they are trimmed back to that
        after every window) and full HiFT caches. A stream reaches it within a few windows,
        so a memory budget charges every open stream this much (consumers.stream.limit)."""
        flow = self.setup(voice).flow
        frames = max(flow.noise_offset, flow.prompt_frames + self.flow_config.att_keep_frames)
        fixed = flow.conformer_cnn_cache, flow.estimator_cnn_cache, flow.spk
        per_frame = sum(
            tensor.nbytes // max(1, tensor.shape[axis])
            for tensor, axis in ((flow.conformer_att_cache, 2), (flow.estimator_att_cache, 4))
        )
        return sum(int(t.nbytes) for t in fixed) + frames * per_frame + self._peak_hift_bytes()

    def _peak_hift_bytes(self) -> int:
        """Scheme A: 8 mel frames, their excitation and held samples (float32). Scheme B: the
        bounded history plus the delay and one internal block, mel and excitation (float32),
        and the float64 phases."""
        if self.causal is not None:
            config, limits = self.causal.config, self.causal.limits
            frames = limits.history + limits.delay + config.block_frames
            values = frames * (config.in_channels + config.samples_per_frame)
            return 4 * values + 8 * (config.nb_harmonics + 1)
        hift = self.hift_config
        return 4 * (hift.in_channels * hift.mel_cache_frames + 2 * hift.cache_samples)

    def default_state_budget_bytes(self) -> int:
        """The default memory budget of open stream states: on CUDA a share of the device
        memory that was free when the engine had loaded its weights (the rest is left to a
        decode batch's working memory); on the CPU a configured constant."""
        if self.device.type == "cuda" and self.free_bytes_at_start is not None:
            return int(self.free_bytes_at_start * CUDA_STATE_BUDGET_SHARE)
        return CPU_STATE_BUDGET_BYTES

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
        ragged = self.batching == "ragged"
        groups = _final_groups(windows) if ragged else self._groups(windows)
        for group in groups:
            decoded = self._decode_ragged(group) if ragged else self._decode_group(group)
            for window, result in zip(group, decoded, strict=True):
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
        if state.hift_variant != self.hift_variant.value:
            raise WindowRejectedError(
                index,
                WindowRejectReason.FOREIGN_STATE,
                f"state of a {state.hift_variant} HiFT engine, this engine's HiFT is "
                f"{self.hift_variant.value}",
            )
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
        self.calls.flow += len(slices)
        self.calls.hift += len(group) if self.batch_invariant else len(slices)
        if len(slices) == 1:  # fewer requests than workers: the flow's rows side by side
            return self._decode_slice(group, group, self._row_threads())
        futures = [self._workers().submit(self._decode_slice, group, part) for part in slices]
        return [result for future in futures for result in future.result()]

    def _row_threads(self) -> RowThreads | None:
        """The workers, for a flow whose estimator rows may run in parts (vocoder.flow
        .parallel): only when batch-invariant (a part's rows are then the whole call's bytes)
        and when there are workers to spare."""
        if not self.batch_invariant or self.workers < 2:
            return None
        return RowThreads(self._side_by_side, self.workers)

    def _side_by_side(self, tasks: Sequence[Callable[[], T]]) -> list[T]:
        """Every task, the first in this thread and the others in the workers (each in the
        engine's scope); all have finished when this returns or raises."""
        futures = [self._workers().submit(self._in_scope, task) for task in tasks[1:]]
        try:
            first = tasks[0]()
        finally:
            concurrent.futures.wait(futures)
        return [first, *(future.result() for future in futures)]

    def _in_scope(self, task: Callable[[], T]) -> T:
        with self.scope(), torch.inference_mode():
            return task()

    def _decode_ragged(self, group: Sequence[_Window]) -> list[tuple[np.ndarray, StreamState]]:
        """Every window of one final flag in one flow and one HiFT call per decode worker
        (vocoder.flow.ragged, vocoder.hift_ragged; the group cut into contiguous slices that the
        workers decode side by side): rows within the documented bound of their solo decode,
        whatever their batch mates. Every row is checked before any computes."""
        final = group[0].final
        refused = self.flow.check_ragged(
            [w.state.flow for w in group], [w.ids for w in group], final
        )
        if refused:
            index, message = refused
            raise WindowRejectedError(group[index].index, WindowRejectReason.FLOW_REFUSED, message)
        slices = _split(group, self.workers)
        self.calls.flow += len(slices)
        self.calls.hift += len(slices)
        if len(slices) == 1:
            return self._decode_ragged_slice(group)
        futures = [self._workers().submit(self._decode_ragged_slice, part) for part in slices]
        return [result for future in futures for result in future.result()]

    def _decode_ragged_slice(self, part: Sequence[_Window]) -> list[tuple[np.ndarray, StreamState]]:
        final = part[0].final
        with self.scope(), torch.inference_mode():
            states = [w.state.flow for w in part]
            mels, flow_states = decode_ragged(self.flow, states, [w.ids for w in part], final)
            seeds = [window_seed(w.state.seed, w.state.window_index) for w in part]
            caches = _noncausal([w.state.hift for w in part])
            step = stream_step_ragged(
                self._scheme_a_hift(), caches, [m.to(torch.float32) for m in mels], final, seeds
            )
        audio = [a.to("cpu").numpy().astype(np.float32, copy=False) for a in step.audio]
        return [
            _advance(w.state, flow_state, cache, samples)
            for w, flow_state, cache, samples in zip(
                part, flow_states, step.caches, audio, strict=True
            )
        ]

    def _workers(self) -> ThreadPoolExecutor:
        """The decode workers. Each applies the engine's intra-op thread count to itself when
        it starts: torch keeps MKL's and OpenMP's counts per thread, and a new thread would
        otherwise run MKL's GEMMs on every core until its first parallel loop set them (other
        last bits on some CPUs: an emulated Intel AVX2 CPU gave a stream whose flow rows were
        split across the workers other audio than the same stream on one worker)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.workers,
                thread_name_prefix="code2wav",
                initializer=torch.set_num_threads,
                initargs=(self.determinism.threads,),
            )
        return self._pool

    def _decode_slice(
        self,
        group: Sequence[_Window],
        part: Sequence[_Window],
        threads: RowThreads | None = None,
    ) -> list[tuple[np.ndarray, StreamState]]:
        with self.scope(), torch.inference_mode():  # per thread: the workers enter them too
            return self._decode_slice_in_scope(group, part, threads)

    def _decode_slice_in_scope(
        self, group: Sequence[_Window], part: Sequence[_Window], threads: RowThreads | None
    ) -> list[tuple[np.ndarray, StreamState]]:
        final = part[0].final
        tokens = torch.tensor([w.ids for w in part], dtype=torch.long, device=self.device)
        try:
            mel, flow_states = self.flow.decode_chunk_batch(
                [w.state.flow for w in part], tokens, final, threads
            )
        except VocoderInputError as exc:  # the flow checks before computing anything
            indices = tuple(w.index for w in group)  # equal shapes: the whole group is refused
            raise WindowRejectedError(
                indices[0], WindowRejectReason.FLOW_REFUSED, str(exc), indices
            ) from exc
        mel = mel.to(torch.float32)
        caches = [w.state.hift for w in part]
        if self.causal is not None:
            audio, new_caches = self._vocode_causal(caches, mel, final)
        else:
            seeds = [window_seed(w.state.seed, w.state.window_index) for w in part]
            audio, new_caches = self._vocode(_noncausal(caches), mel, final, seeds)
        return [
            _advance(w.state, flow_state, cache, samples)
            for w, flow_state, cache, samples in zip(
                part, flow_states, new_caches, audio, strict=True
            )
        ]

    def _vocode_causal(
        self, caches: Sequence[HiftState], mel: Tensor, final: bool
    ) -> tuple[list[np.ndarray], list[HiftState]]:
        """Scheme B: the causal vocoder streams the rows (one at a time when batch-invariant,
        see CausalVocoder); no noise is drawn per call, so no window seed is needed."""
        assert self.causal is not None
        causal = [cache for cache in caches if isinstance(cache, CausalHiftCache)]
        if len(causal) != len(caches):
            raise VocoderInputError("a non-causal HiFT state reached the causal vocoder")
        step = self.causal.step(causal, mel, final)
        audio = [a.to("cpu").numpy().astype(np.float32, copy=False) for a in step.audio]
        return audio, list(step.caches)

    def _vocode(
        self, caches: list[HiftCache], mel: Tensor, final: bool, seeds: list[int]
    ) -> tuple[list[np.ndarray], list[HiftState]]:
        hift = self._scheme_a_hift()
        if self.batch_invariant:
            steps = [
                stream_step(hift, [cache], mel[row : row + 1], final, [seed])
                for row, (cache, seed) in enumerate(zip(caches, seeds, strict=True))
            ]
            audio = [step.audio[0] for step in steps]
            new_caches = [step.caches[0] for step in steps]
        else:
            step = stream_step(hift, caches, mel, final, seeds)
            audio, new_caches = step.audio, step.caches
        samples = [a.to("cpu").numpy().astype(np.float32, copy=False) for a in audio]
        return samples, list(new_caches)


def _free_device_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA device now (None elsewhere)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


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


def _final_groups(windows: Sequence[_Window]) -> list[list[_Window]]:
    """The ragged path's groups: non-final windows, then final ones (at most two)."""
    groups = [[w for w in windows if not w.final], [w for w in windows if w.final]]
    return [group for group in groups if group]


def _split(items: Sequence[_Window], parts: int) -> list[Sequence[_Window]]:
    """`items` in at most `parts` contiguous slices of near-equal size (order kept)."""
    return [items[rows] for rows in row_parts(len(items), parts)]


def half_precision_refusal() -> str:
    """The one-line refusal of float16 on the CPU (bfloat16 runs there)."""
    return "float16 (half precision) is for CUDA; on the CPU use float32 or bfloat16"


def _noncausal(caches: Sequence[HiftState]) -> list[HiftCache]:
    out = [cache for cache in caches if isinstance(cache, HiftCache)]
    if len(out) != len(caches):
        raise VocoderInputError("a causal HiFT state reached the non-causal vocoder")
    return out


def _advance(
    state: StreamState, flow: FlowState, cache: HiftState, audio: np.ndarray
) -> tuple[np.ndarray, StreamState]:
    if flow.finished:  # nothing is held after the final window: drop the tails
        if isinstance(cache, CausalHiftCache):
            cache = dataclasses.replace(cache, mel=cache.mel[:, :0], source=cache.source[:0])
        else:
            cache = HiftCache(cache.mel[:, :0], cache.source[:0], cache.speech[:0])
    new_state = dataclasses.replace(
        state,
        flow=flow,
        hift=cache,
        window_index=state.window_index + 1,
        samples_emitted=state.samples_emitted + int(audio.shape[0]),
    )
    return audio, new_state
