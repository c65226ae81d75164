"""One slice of a decode_batch call, decoded in the calling thread: its flow, its HiFT, each
window's audio and next StreamState (docs/vocoder.md, "Inside a decode_batch call")."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from codeclog.vocoder.determinism import window_seed
from codeclog.vocoder.engine.stream_state import HiftState, StreamState
from codeclog.vocoder.engine.window_checks import Window, flow_refused
from codeclog.vocoder.errors import VocoderInputError
from codeclog.vocoder.flow import FlowState, Token2WavFlow
from codeclog.vocoder.flow.parallel import RowThreads
from codeclog.vocoder.flow.ragged import decode_ragged
from codeclog.vocoder.hift.causal_stream import CausalHiftCache, CausalVocoder
from codeclog.vocoder.hift.noncausal import HiFTGenerator
from codeclog.vocoder.hift.noncausal_stream import HiftCache, stream_step, stream_step_ragged

Decoded = tuple[np.ndarray, StreamState]


@dataclasses.dataclass(frozen=True)
class SliceDecoder:
    """The engine's models: the flow, and either scheme A's `hift` or scheme B's `causal`
    vocoder. batch_invariant: scheme A vocodes the rows one at a time (the causal vocoder
    applies its own flag)."""

    flow: Token2WavFlow
    hift: HiFTGenerator | None
    causal: CausalVocoder | None
    device: torch.device
    batch_invariant: bool

    def exact(
        self, group: Sequence[Window], part: Sequence[Window], threads: RowThreads | None
    ) -> list[Decoded]:
        """`part` of an equal-shape `group`: one flow call, then HiFT. When the flow refuses,
        every item of the group is refused (equal shapes: the same checks)."""
        final = part[0].final
        tokens = torch.tensor([w.ids for w in part], dtype=torch.long, device=self.device)
        try:
            mel, flow_states = self.flow.decode_chunk_batch(
                [w.state.flow for w in part], tokens, final, threads
            )
        except VocoderInputError as exc:  # the flow checks before computing anything
            raise flow_refused(tuple(w.index for w in group), str(exc)) from exc
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

    def ragged(self, part: Sequence[Window]) -> list[Decoded]:
        """Windows of any lengths and one final flag in one flow and one HiFT call (vocoder.flow
        .ragged, vocoder.hift.rows); the flow's checks ran for the whole group before."""
        final = part[0].final
        states = [w.state.flow for w in part]
        mels, flow_states = decode_ragged(self.flow, states, [w.ids for w in part], final)
        seeds = [window_seed(w.state.seed, w.state.window_index) for w in part]
        caches = _noncausal([w.state.hift for w in part])
        step = stream_step_ragged(
            self._scheme_a_hift(), caches, [m.to(torch.float32) for m in mels], final, seeds
        )
        return [
            _advance(w.state, flow_state, cache, samples)
            for w, flow_state, cache, samples in zip(
                part, flow_states, step.caches, _to_numpy(step.audio), strict=True
            )
        ]

    def _scheme_a_hift(self) -> HiFTGenerator:
        assert self.hift is not None
        return self.hift

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
        return _to_numpy(step.audio), list(step.caches)

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
        return _to_numpy(audio), list(new_caches)


def _to_numpy(audio: Sequence[Tensor]) -> list[np.ndarray]:
    return [a.to("cpu").numpy().astype(np.float32, copy=False) for a in audio]


def _noncausal(caches: Sequence[HiftState]) -> list[HiftCache]:
    out = [cache for cache in caches if isinstance(cache, HiftCache)]
    if len(out) != len(caches):
        raise VocoderInputError("a causal HiFT state reached the non-causal vocoder")
    return out


def _advance(state: StreamState, flow: FlowState, cache: HiftState, audio: np.ndarray) -> Decoded:
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
