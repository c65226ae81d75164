"""Scheme B's bounded streaming rule: `CausalVocoder` streams rows through one
`CausalHiFTGenerator`; `CausalHiftCache` is one stream's state between calls (docs/vocoder.md,
"Scheme B")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction

import torch
from torch import Tensor, nn

from codeclog.vocoder.errors import VocoderInputError
from codeclog.vocoder.hift.causal import (
    CausalHiftConfig,
    CausalHiFTGenerator,
    CausalResBlock,
    causal_padding_of,
)
from codeclog.vocoder.hift.layers import fuse_weight_norm

F64 = torch.float64


@dataclasses.dataclass(frozen=True)
class CausalLimits:
    """Frame counts of the streaming rule (upstream `context_sizes` / `limits`)."""

    f0_left: int  # frames of history the F0 predictor's left convs read (8)
    f0_right: int  # F0 look-ahead (3)
    history: int  # decoder history frames re-vocoded per call
    decoder_right: int  # conv_pre look-ahead + the held iSTFT frame (5)

    @property
    def delay(self) -> int:
        return self.f0_right + self.decoder_right


def context_limits(model: CausalHiFTGenerator) -> CausalLimits:
    config = model.config
    rate = math.prod(config.upsample_rates)
    transform = Fraction(config.istft_n_fft, rate * config.istft_hop)
    kernels = len(config.resblock_kernel_sizes)
    history, scale = Fraction(0), 1
    for stage, upsample in enumerate(model.ups):
        scale *= config.upsample_rates[stage]
        history += Fraction(causal_padding_of(upsample), scale)
        down = model.source_downs[stage]
        assert isinstance(down, nn.Conv1d)
        source_history = (
            transform
            + Fraction((down.kernel_size[0] - 1) * down.dilation[0], rate)
            + Fraction(_resblock(model.source_resblocks[stage]).history(), scale)
        )
        residuals = list(model.resblocks)[stage * kernels : (stage + 1) * kernels]
        deepest = max(_resblock(block).history() for block in residuals)
        history = max(history, source_history) + Fraction(deepest, scale)
    history += Fraction(causal_padding_of(model.conv_post) + 1, rate) + transform
    return CausalLimits(
        f0_left=model.f0_predictor.left_context,
        f0_right=model.f0_predictor.right_context,
        history=int(math.ceil(history) + 2),  # 2 frames for grid alignment, as upstream
        decoder_right=config.conv_pre_look_right + 1,
    )


def _resblock(module: nn.Module) -> CausalResBlock:
    assert isinstance(module, CausalResBlock)
    return module


@dataclasses.dataclass(frozen=True)
class CausalHiftCache:
    """Per-stream state between calls (no batch dimension). Offsets are absolute mel frames.

    mel: (80, M) received frames from mel_offset on (the bounded history plus the look-ahead).
    source: (S * 480,) excitation from source_offset on, up to source_end.
    phase: (nb_harmonics + 1,) float64 harmonic phases (cycles, modulo 1) at source_end.
    emitted: frames vocoded and emitted so far. started: audio (or the lead-in) was emitted.
    """

    mel: Tensor
    source: Tensor
    phase: Tensor
    mel_offset: int = 0
    source_offset: int = 0
    source_end: int = 0
    emitted: int = 0
    started: bool = False
    finalized: bool = False

    @classmethod
    def empty(cls, config: CausalHiftConfig, device: torch.device | str = "cpu") -> CausalHiftCache:
        return cls(
            mel=torch.zeros(config.in_channels, 0, device=device),
            source=torch.zeros(0, device=device),
            phase=torch.zeros(config.nb_harmonics + 1, dtype=F64, device=device),
        )

    @property
    def received(self) -> int:
        return self.mel_offset + int(self.mel.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.mel.nbytes + self.source.nbytes + self.phase.nbytes)


@dataclasses.dataclass
class _Counters:
    """The integer state of one group during a step (relative slicing is the same per row)."""

    mel_offset: int
    source_offset: int
    source_end: int
    emitted: int
    mel_frames: int  # frames in the group's mel buffer


@dataclasses.dataclass(frozen=True)
class CausalStep:
    audio: list[Tensor]  # (samples,) float32 per row
    caches: list[CausalHiftCache]


class CausalVocoder:
    """Streams B rows through one CausalHiFTGenerator (upstream `BoundedVocoder`, batched).

    Construction converts the F0 predictor to float64 (as upstream does), fuses weight norm if
    asked (the same weights: the norm is then computed once, in the predictor's float64) and
    builds the noise table from `config.noise_seed`. Rows whose integer state gives the same
    call plan run in one batch; the others in their own groups, in input order.

    batch_invariant (default: on the CPU) vocodes the rows of a group one at a time: the native
    CPU convolutions are not batch-invariant (measured: up to 1.0e-5 in the audio, 3e-14 in the
    float64 F0, batch 3 vs 1), and a row's bytes must not depend on its batch mates there.
    """

    def __init__(
        self,
        model: CausalHiFTGenerator,
        *,
        fuse: bool = True,
        device: str | torch.device = "cpu",
        batch_invariant: bool | None = None,
    ) -> None:
        device = torch.device(device)
        self.batch_invariant = device.type == "cpu" if batch_invariant is None else batch_invariant
        self.model = model.eval()
        self.config = model.config
        self.model.f0_predictor.double()
        if fuse:
            fuse_weight_norm(self.model)
        self.model.to(device)
        self.limits = context_limits(model)
        self.hop = self.config.samples_per_frame
        generator = torch.Generator(device="cpu").manual_seed(self.config.noise_seed)
        harmonics = self.config.nb_harmonics + 1
        table = torch.rand(self.config.noise_table_samples, harmonics, generator=generator)
        self.noise_table = table.to(device)

    @property
    def lead_in_samples(self) -> int:
        return self.limits.delay * self.hop

    def empty_cache(self) -> CausalHiftCache:
        return CausalHiftCache.empty(self.config, self.noise_table.device)

    # -- planning: which rows can share one batched call ----------------------------------

    def plan(self, cache: CausalHiftCache, frames: int, final: bool) -> tuple[int, ...]:
        """The slice lengths a step makes for this row: rows with equal plans batch together."""
        counters = _counters(cache)
        trace: list[int] = []
        for part in self._parts(frames):
            counters.mel_frames += part
            self._advance(counters, False, trace)
        if final:
            self._advance(counters, True, trace)
        return (int(cache.started), int(cache.mel.shape[1]), int(cache.source.shape[0]), *trace)

    def _parts(self, frames: int) -> list[int]:
        block = self.config.block_frames
        return [min(block, frames - start) for start in range(0, frames, block)]

    def _advance(self, c: _Counters, finalize: bool, trace: list[int]) -> None:
        """The integer half of one upstream `_process` call (shared by plan and step)."""
        limits = self.limits
        received = c.mel_offset + c.mel_frames
        available_source = max(0, received - (0 if finalize else limits.f0_right))
        if available_source > c.source_end:
            start = max(0, c.source_end - limits.f0_left)
            trace += [1, start - c.mel_offset, c.source_end - start]
            trace += [available_source - c.source_end]
            c.source_end = available_source
        available_speech = max(0, c.source_end - (0 if finalize else limits.decoder_right))
        if available_speech > c.emitted:
            start = max(0, c.emitted - limits.history)
            trace += [2, start - c.mel_offset, c.source_end - start, start - c.source_offset]
            trace += [c.emitted - start]
            c.emitted = available_speech
        keep_mel = max(0, min(c.emitted - limits.history, c.source_end - limits.f0_left))
        keep_source = max(0, c.emitted - limits.history)
        trace += [3, keep_mel - c.mel_offset, keep_source - c.source_offset]
        c.mel_frames -= keep_mel - c.mel_offset
        c.mel_offset, c.source_offset = keep_mel, keep_source

    # -- compute --------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, caches: Sequence[CausalHiftCache], mel: Tensor, final: bool) -> CausalStep:
        """Vocode fresh mel (B, 80, F) for B streams; `final` flushes every row."""
        if mel.dim() != 3 or mel.shape[0] != len(caches) or mel.shape[1] != self.config.in_channels:
            raise VocoderInputError(f"mel must be (B={len(caches)}, 80, frames)")
        for cache in caches:
            if cache.finalized:
                raise VocoderInputError("the stream is finalized; start a new cache")
        frames = int(mel.shape[2])
        groups: dict[tuple[int, ...], list[int]] = {}
        for row, cache in enumerate(caches):
            groups.setdefault(self.plan(cache, frames, final), []).append(row)
        audio: list[Tensor] = [mel.new_zeros(0)] * len(caches)
        new: list[CausalHiftCache] = list(caches)
        batches = [[row] for rows in groups.values() for row in rows]
        for rows in batches if self.batch_invariant else list(groups.values()):
            out, updated = self._step_group([caches[r] for r in rows], mel[rows], final)
            for index, row in enumerate(rows):
                audio[row], new[row] = out[index], updated[index]
        return CausalStep(audio, new)

    def _step_group(
        self, caches: Sequence[CausalHiftCache], mel: Tensor, final: bool
    ) -> tuple[list[Tensor], list[CausalHiftCache]]:
        c = _counters(caches[0])
        # per-row absolute source position minus the group's: noise is read per row
        shifts = torch.tensor([k.source_end - c.source_end for k in caches], dtype=torch.long)
        state = _Buffers(
            mel=torch.stack([k.mel for k in caches]).float(),
            source=torch.stack([k.source for k in caches]).unsqueeze(1),
            phase=torch.stack([k.phase for k in caches]).unsqueeze(1),
        )
        chunks: list[Tensor] = []
        with torch.autocast(mel.device.type, enabled=False):
            for part in mel.split(self.config.block_frames, dim=2):
                if not part.shape[2]:
                    continue
                state.mel = torch.cat([state.mel, part.float()], dim=2)
                c.mel_frames = int(state.mel.shape[2])
                chunks.append(self._process(state, c, shifts, False))
            if final:
                chunks.append(self._process(state, c, shifts, True))
        speech = torch.cat(chunks, dim=1) if chunks else mel.new_zeros(len(caches), 0)
        started = caches[0].started
        if speech.shape[1] and not started:
            started = True
            if not final:
                speech = torch.cat([speech.new_zeros(len(caches), self.lead_in_samples), speech], 1)
        audio = [speech[row].clone() for row in range(len(caches))]
        updated = [
            CausalHiftCache(
                mel=state.mel[row].clone(),
                source=state.source[row, 0].clone(),
                phase=state.phase[row, 0].clone(),
                mel_offset=k.mel_offset + (c.mel_offset - caches[0].mel_offset),
                source_offset=k.source_offset + (c.source_offset - caches[0].source_offset),
                source_end=k.source_end + (c.source_end - caches[0].source_end),
                emitted=k.emitted + (c.emitted - caches[0].emitted),
                started=started,
                finalized=final,
            )
            for row, k in enumerate(caches)
        ]
        return audio, updated

    def _process(self, s: _Buffers, c: _Counters, shifts: Tensor, finalize: bool) -> Tensor:
        """Upstream `_process` on a batch whose rows share the integer state `c`."""
        model, limits, hop = self.model, self.limits, self.hop
        received = c.mel_offset + c.mel_frames
        available_source = max(0, received - (0 if finalize else limits.f0_right))
        if available_source > c.source_end:
            start = max(0, c.source_end - limits.f0_left)
            features = s.mel[:, :, start - c.mel_offset :]
            f0 = model.f0_predictor(features.double(), finalize=finalize).to(features)
            f0 = f0[:, c.source_end - start :]
            sources = [s.source]
            for part in f0.split(self.config.block_frames, dim=1):
                sources.append(self._source(part, s, shifts + c.source_end))
                c.source_end += int(part.shape[1])
            s.source = torch.cat(sources, dim=2)
        available_speech = max(0, c.source_end - (0 if finalize else limits.decoder_right))
        speech = s.mel.new_zeros(s.mel.shape[0], 0)
        if available_speech > c.emitted:
            start = max(0, c.emitted - limits.history)
            features = s.mel[:, :, start - c.mel_offset : c.source_end - c.mel_offset]
            source = s.source[:, :, (start - c.source_offset) * hop :]
            speech = model.decode(features, source, finalize=finalize)
            speech = speech[:, (c.emitted - start) * hop :]
            if speech.shape[1] != (available_speech - c.emitted) * hop:
                raise RuntimeError("causal HiFT returned an unexpected sample count")
            c.emitted = available_speech
        keep_mel = max(0, min(c.emitted - limits.history, c.source_end - limits.f0_left))
        keep_source = max(0, c.emitted - limits.history)
        s.mel = s.mel[:, :, keep_mel - c.mel_offset :]
        s.source = s.source[:, :, (keep_source - c.source_offset) * hop :]
        c.mel_offset, c.source_offset = keep_mel, keep_source
        c.mel_frames = int(s.mel.shape[2])
        return speech

    def _source(self, f0: Tensor, s: _Buffers, frame_offsets: Tensor) -> Tensor:
        """Excitation (B, 1, T*480) of F0 frames (B, T) starting at absolute frame_offsets (B,):
        float64 phase per frame (constant over the frame, as upstream's nearest upsampling
        after 1/hop linear sampling gives), the table's noise at absolute sample positions."""
        config, hop = self.config, self.hop
        harmonics = torch.arange(1, config.nb_harmonics + 2, device=f0.device, dtype=f0.dtype)
        increments = (f0[:, :, None] * harmonics / config.sampling_rate_hz).remainder(1)
        cycles = increments.double().cumsum(dim=1) * hop + s.phase
        s.phase = cycles[:, -1:].remainder(1).clone()
        sine = (cycles.remainder(1) * (2 * math.pi)).sin().to(f0).repeat_interleave(hop, dim=1)
        voiced = (f0[:, :, None] > config.nsf_voiced_threshold_hz).to(f0)
        voiced = voiced.repeat_interleave(hop, dim=1)
        noise_amplitude = voiced * config.nsf_sigma + (1 - voiced) * config.nsf_alpha / 3
        table = self.noise_table
        steps = torch.arange(sine.shape[1], device=table.device)
        positions = (frame_offsets.to(table.device)[:, None] * hop + steps).remainder(
            table.shape[0]
        )
        noise = table[positions].to(f0)
        excitation = sine * config.nsf_alpha * voiced + noise_amplitude * noise
        return self.model.m_source(excitation).transpose(1, 2)


@dataclasses.dataclass
class _Buffers:
    mel: Tensor  # (B, 80, M)
    source: Tensor  # (B, 1, S*480)
    phase: Tensor  # (B, 1, 9) float64


def _counters(cache: CausalHiftCache) -> _Counters:
    return _Counters(
        mel_offset=cache.mel_offset,
        source_offset=cache.source_offset,
        source_end=cache.source_end,
        emitted=cache.emitted,
        mel_frames=int(cache.mel.shape[1]),
    )


def emitted_samples(frames_per_call: Sequence[int], delay: int = 8, hop: int = 480) -> list[int]:
    """The documented sample-count rule (docs/vocoder.md, "Scheme B"): samples each call emits
    for a stream fed these mel frame counts, the last call final. Used by tests and the engine."""
    out: list[int] = []
    received = emitted = 0
    for index, frames in enumerate(frames_per_call):
        final = index == len(frames_per_call) - 1
        received += frames
        available = received if final else max(0, received - delay)
        count = max(0, available - emitted) * hop
        if count and emitted == 0 and not final:
            count += delay * hop
        emitted = max(emitted, available)
        out.append(count)
    return out
