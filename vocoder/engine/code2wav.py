"""`Code2WavEngine`: codec-id windows in, 24 kHz audio out, every stream's state a value the
caller owns (its manual: docs/vocoder.md, "Using the engine", and the sections after it)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from codeclog.vocoder.checkpoint import (
    HiftVariant,
    choose_hift_variant,
    inspect_checkpoint,
    load_causal_fixture,
    load_causal_hift,
    load_checkpoint,
    load_fixture,
)
from codeclog.vocoder.determinism import DeterminismSettings, apply_determinism
from codeclog.vocoder.domain import determinism_domain, engine_domain_suffix
from codeclog.vocoder.engine.memory_budget import (
    free_device_bytes,
    peak_state_bytes,
    state_budget_bytes,
)
from codeclog.vocoder.engine.options import (
    DTYPES,
    EngineOptions,
    check_choices,
    check_placement,
    default_kernels,
)
from codeclog.vocoder.engine.slice_decode import Decoded, SliceDecoder
from codeclog.vocoder.engine.slicing import (
    DecodeWorkers,
    default_workers,
    equal_shape_groups,
    final_groups,
    split,
)
from codeclog.vocoder.engine.stream_state import HiftState, StreamState
from codeclog.vocoder.engine.window_checks import (
    DecodeItem,
    Window,
    WindowRules,
    flow_refused,
)
from codeclog.vocoder.errors import VocoderConfigError, VocoderInputError
from codeclog.vocoder.flow import FlowState, Token2WavFlow
from codeclog.vocoder.flow.parallel import RowThreads
from codeclog.vocoder.flow.stable import gemm_tile, tiled_gemms
from codeclog.vocoder.hift.causal import CausalHiFTGenerator
from codeclog.vocoder.hift.causal_stream import CausalVocoder
from codeclog.vocoder.hift.config import HiftConfig
from codeclog.vocoder.hift.layers import fuse_weight_norm
from codeclog.vocoder.hift.noncausal import HiFTGenerator
from codeclog.vocoder.hift.noncausal_stream import HiftCache
from codeclog.vocoder.kernels import Kernels, kernel_scope
from codeclog.vocoder.voice import Voice, default_voice

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11 on

SAMPLE_RATE_HZ = 24000
PROMPT_CACHE_SIZE = 8  # voices whose prompt state is kept (each is ~1 MB per prompt frame, full)


@dataclasses.dataclass
class DecodeCalls:
    """Model calls an engine made: `flow` (conformer + CFM solve) and `hift` (vocoder)."""

    flow: int = 0
    hift: int = 0

    def since(self, before: DecodeCalls) -> DecodeCalls:
        return DecodeCalls(self.flow - before.flow, self.hift - before.hift)

    def copy(self) -> DecodeCalls:
        return DecodeCalls(self.flow, self.hift)


class Code2WavEngine:
    """Token2wav flow + HiFT (scheme A, or the causal HiFT of scheme B when `hift` is a
    CausalHiFTGenerator) with explicit per-request state (docs/vocoder.md, "Using the engine")."""

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
        causal = isinstance(hift, CausalHiFTGenerator)
        check_choices(dtype, batching, causal)
        self.hift_variant = HiftVariant.CAUSAL if causal else HiftVariant.NONCAUSAL
        self.batching = batching
        self.calls = DecodeCalls()  # flow and HiFT calls so far (a step's count: the delta)
        self.device = torch.device(options.get("device", "cpu"))
        kernels = options.get("kernels")
        self.kernels = default_kernels(self.device) if kernels is None else Kernels.parse(kernels)
        check_placement(self.device, self.kernels, batching, dtype)
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
        self._decode_workers = DecodeWorkers(self.workers, self.determinism.threads, self.scope)
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
        self._rules = WindowRules(
            vocab_size=self.flow_config.vocab_size,
            lookahead=self.flow_config.pre_lookahead_len,
            mel_dim=self.flow_config.mel_dim,
            hift_channels=self.hift_config.in_channels,
            hift_variant=self.hift_variant.value,
        )
        self._decoder = SliceDecoder(
            flow=self.flow,
            hift=self.hift if isinstance(self.hift, HiFTGenerator) else None,
            causal=self.causal,
            device=self.device,
            batch_invariant=self.batch_invariant,
        )
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
        self.free_bytes_at_start = free_device_bytes(self.device)

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
        batch-invariant with exact batching, GEMMs over fixed row tiles (vocoder.flow.stable
        .tiled_gemms). Ragged rows are within a bound of their solo decode, not its bytes,
        whatever their GEMMs: a ragged engine's take the whole batch, as a GPU's do."""
        exact_rows = self.batch_invariant and self.batching == "exact"
        rows = tiled_gemms() if exact_rows else contextlib.nullcontext()
        with kernel_scope(self.kernels), rows:
            yield

    @property
    def gemm_tile_rows(self) -> int | None:
        """Rows per GEMM tile of the flow (vocoder.flow.stable.tiled_gemms), None when its GEMMs
        take the whole batch (not batch-invariant, ragged) or the portable kernels run."""
        tiled = self.batch_invariant and self.batching == "exact"
        return gemm_tile(self.device) if tiled and self.kernels is Kernels.NATIVE else None

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
            "gemm_tile_rows": self.gemm_tile_rows,
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
        """The most bytes one stream's state of `voice` ever holds between windows; a memory
        budget charges every open stream this much (vocoder.engine.memory_budget)."""
        flow, keep = self.setup(voice).flow, self.flow_config.att_keep_frames
        return peak_state_bytes(flow, keep, self.hift_config, self.causal)

    def default_state_budget_bytes(self) -> int:
        """The default memory budget of open stream states (vocoder.engine.memory_budget)."""
        return state_budget_bytes(self.device, self.free_bytes_at_start)

    def release(self, state: StreamState) -> None:
        """The stream is over. A StreamState owns its tensors (the shared prompt state is
        read-only and cached per voice), so there is nothing to free here beyond dropping the
        reference; the call marks the end of a stream in the interface, for engines that pool
        per-stream memory."""
        if not isinstance(state, StreamState):
            raise VocoderInputError("release() takes a StreamState")

    # -- decoding ----------------------------------------------------------------------------

    def decode_batch(self, items: Sequence[DecodeItem]) -> list[Decoded]:
        """Decode one window per item; returns (float32 mono 24 kHz audio, new state) per item,
        in order. Every item is checked first (WindowRejectedError names the first bad one);
        see docs/vocoder.md for grouping, exactness and the sample-count rules."""
        windows = [self._validate(index, item) for index, item in enumerate(items)]
        results: list[Decoded | None] = [None] * len(windows)
        ragged = self.batching == "ragged"
        groups = final_groups(windows) if ragged else self._groups(windows)
        for group in groups:
            decoded = self._decode_ragged(group) if ragged else self._decode_group(group)
            for window, result in zip(group, decoded, strict=True):
                results[window.index] = result
        return [result for result in results if result is not None]

    def _validate(self, index: int, item: DecodeItem) -> Window:
        """Item `index`, checked (vocoder.engine.window_checks), its state on the engine's
        device."""
        window = self._rules.check(index, item)
        return dataclasses.replace(window, state=self._on_device(window.state))

    _groups = staticmethod(equal_shape_groups)  # the exact path's groups (vocoder.engine.slicing)

    def _on_device(self, state: StreamState) -> StreamState:
        if state.hift_mel.device == self.device and state.flow.spk.device == self.device:
            return state
        return state.to(self.device)

    def _decode_group(self, group: Sequence[Window]) -> list[Decoded]:
        """One group, split into contiguous slices decoded side by side by the workers when the
        decode is batch-invariant (then a slice's rows get exactly the bytes of the whole
        group's: this is how a CPU batch uses more than one core without losing exactness)."""
        slices = split(group, self.workers if self.batch_invariant else 1)
        self.calls.flow += len(slices)
        self.calls.hift += len(group) if self.batch_invariant else len(slices)
        if len(slices) == 1:  # fewer requests than workers: the flow's rows side by side
            threads = self._decode_workers.row_threads() if self.batch_invariant else None
            return self._decode_slice(group, group, threads)
        return self._decode_workers.map_slices(functools.partial(self._decode_slice, group), slices)

    def _decode_slice(
        self, group: Sequence[Window], part: Sequence[Window], threads: RowThreads | None = None
    ) -> list[Decoded]:
        with self.scope(), torch.inference_mode():  # per thread: the workers enter them too
            return self._decoder.exact(group, part, threads)

    def _decode_ragged(self, group: Sequence[Window]) -> list[Decoded]:
        """Every window of one final flag in one flow and one HiFT call per decode worker
        (vocoder.flow.ragged, vocoder.hift.rows; the group cut into contiguous slices that the
        workers decode side by side): rows within the documented bound of their solo decode,
        whatever their batch mates. Every row is checked before any computes."""
        final = group[0].final
        refused = self.flow.check_ragged(
            [w.state.flow for w in group], [w.ids for w in group], final
        )
        if refused:
            index, message = refused
            raise flow_refused((group[index].index,), message)
        slices = split(group, self.workers)
        self.calls.flow += len(slices)
        self.calls.hift += len(slices)
        if len(slices) == 1:
            return self._decode_ragged_slice(group)
        return self._decode_workers.map_slices(self._decode_ragged_slice, slices)

    def _decode_ragged_slice(self, part: Sequence[Window]) -> list[Decoded]:
        with self.scope(), torch.inference_mode():
            return self._decoder.ragged(part)
