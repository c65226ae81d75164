"""Token2WavFlow: CausalMaskedDiffWithXvec (tokens -> 50 Hz mel) under upstream's names, every
per-request value in a `FlowState` the caller owns (docs/vocoder.md, "The flow")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from codeclog.vocoder.flow.cfm import ConditionalFlowMatching
from codeclog.vocoder.flow.config import FlowConfig
from codeclog.vocoder.flow.encoder import RelPositionAttention, UpsampleConformerEncoderV2
from codeclog.vocoder.flow.errors import FlowInputError, FlowRejectReason
from codeclog.vocoder.flow.parallel import RowThreads
from codeclog.vocoder.flow.stable import META, StableLinear
from codeclog.vocoder.flow.state import (
    BatchCaches,
    FlowState,
    split_caches,
    stack_states,
    trim_state,
)


class Token2WavFlow(nn.Module):
    """The Step-Audio2 / MiniCPM-o 4.5 Token2wav flow; sizes from `FlowConfig`."""

    def __init__(self, config: FlowConfig, *, device: torch.device | str = "cpu") -> None:
        """Random weights from `config.init_seed` (load a checkpoint to replace them).

        device "meta" builds the module tree only (no memory): enough to check checkpoint keys
        and shapes of the full-size model on a small machine.
        """
        super().__init__()
        self.config = config
        # Every weight is allocated on the meta device, then materialised once and initialised
        # from a seeded generator: building a model never touches (or advances) the global RNG.
        # (`_weight` given: no init on meta. nn.Embedding's own normal_ on a meta tensor goes
        # through torch._refs, whose first use imports torch._dynamo: 3 s of every start.)
        table = torch.empty(config.vocab_size, config.input_size, device=META)
        self.input_embedding = nn.Embedding(config.vocab_size, config.input_size, _weight=table)
        self.spk_embed_affine_layer = StableLinear(config.spk_embed_dim, config.mel_dim)
        self.encoder = UpsampleConformerEncoderV2(config)
        self.encoder_proj = StableLinear(config.input_size, config.mel_dim)
        self.decoder = ConditionalFlowMatching(config)
        self.eval()
        if torch.device(device) == META:
            return
        self.to_empty(device="cpu")
        initialise_parameters(self, config.init_seed)
        self.fill_buffers()
        self.to(device)

    def fill_buffers(self) -> None:
        """(Re)compute the constant tables on the parameters' device and dtype."""
        self.encoder.fill_buffers()
        self.decoder.fill_buffers()

    @property
    def device(self) -> torch.device:
        return self.input_embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.input_embedding.weight.dtype

    @torch.inference_mode()
    def prepare_prompt(
        self, prompt_tokens: Tensor, prompt_mel: Tensor, spk_embedding: Tensor
    ) -> FlowState:
        """The per-voice initial state (upstream `setup_cache`), deterministic.

        prompt_tokens (Tp,) ids; prompt_mel (ratio * Tp, mel_dim); spk_embedding (spk_dim,).
        Runs the flow over the prompt tokens plus `pre_lookahead_len` silence ids with the
        prompt mel as condition. Cache the result per voice and share it: it is never mutated.
        """
        self._check_prompt(prompt_tokens, prompt_mel, spk_embedding)
        config = self.config
        lookahead = prompt_tokens.new_full(
            (config.pre_lookahead_len,), config.setup_lookahead_token
        )
        tokens = torch.cat([prompt_tokens.to(self.device), lookahead.to(self.device)])[None]
        spk = F.normalize(spk_embedding.to(self.device, self.dtype)[None], dim=1)
        spk = self.spk_embed_affine_layer(spk)
        h, cnn, att = self.encoder.forward_chunk(self.input_embedding(tokens), False, None, None)
        mu = self.encoder_proj(h).transpose(1, 2).contiguous()
        cond = prompt_mel.to(self.device, self.dtype).t()[None].contiguous()
        _, est_cnn, est_att = self.decoder.forward_chunk(mu, spk, cond, None, None)
        caches = BatchCaches(cnn, att, est_cnn, est_att, spk)
        return split_caches(caches, prompt_frames=cond.shape[2], chunks_done=[0], finished=False)[0]

    @torch.inference_mode()
    def decode_chunk_batch(
        self,
        states: Sequence[FlowState],
        tokens: Tensor,
        last_chunk: bool,
        threads: RowThreads | None = None,
    ) -> tuple[Tensor, list[FlowState]]:
        """One streaming window for B requests whose states share a `shape_signature`.

        tokens (B, T): each row is a window whose last `pre_lookahead_len` ids are right
        context only (they are sent again at the start of the next window), unless
        `last_chunk`, where the lookahead is zero-padded. Returns the mel (B, mel_dim, F),
        F = ratio * (T - lookahead) or ratio * T on the last chunk, and B new states. Inputs are
        never mutated. Row b depends only on states[b] and tokens[b]: on CPU, a batch gives each
        request exactly the bytes it gets alone. `threads`: the flow-matching estimator's rows
        in parts side by side (vocoder.flow.parallel; the same bytes).
        """
        self._check_batch(states, tokens, last_chunk)
        if tokens.shape[1] == 0:  # an empty final window only ends the stream
            done = [dataclasses.replace(s, finished=True) for s in states]
            return self.encoder_proj.weight.new_zeros((len(states), self.config.mel_dim, 0)), done
        caches = stack_states(states, self.device)
        xs = self.input_embedding(tokens.to(self.device, torch.long))
        h, cnn, att = self.encoder.forward_chunk(
            xs, last_chunk, caches.conformer_cnn, caches.conformer_att
        )
        mu = self.encoder_proj(h).transpose(1, 2).contiguous()
        mel, est_cnn, est_att = self.decoder.forward_chunk(
            mu,
            caches.spk,
            torch.zeros_like(mu),
            caches.estimator_cnn,
            caches.estimator_att,
            threads,
        )
        new = split_caches(
            BatchCaches(cnn, att, est_cnn, est_att, caches.spk),
            prompt_frames=states[0].prompt_frames,
            chunks_done=[state.chunks_done + 1 for state in states],
            finished=last_chunk,
        )
        return mel, [trim_state(state, self.config) for state in new]

    def check_ragged(
        self, states: Sequence[FlowState], windows: Sequence[Sequence[int]], last_chunk: bool
    ) -> tuple[int, str] | None:
        """(row, why) for the first row `vocoder.flow.ragged.decode_ragged` cannot decode, or
        None. Rows may differ in window and cache lengths, not in prompt layout or dtype."""
        for row, (state, window) in enumerate(zip(states, windows, strict=True)):
            if state.finished:
                return row, "a state cannot continue after its final window"
            if not window or (not last_chunk and len(window) <= self.config.pre_lookahead_len):
                return row, "a window needs at least one new id"
            if state.spk.dtype != self.dtype:
                return row, f"state dtype {state.spk.dtype} differs from the model's {self.dtype}"
            fresh = self.output_frames(len(window), last_chunk)
            try:
                self._check_capacity(cached_frames=state.noise_offset, new_frames=fresh)
            except FlowInputError as exc:
                return row, str(exc)
        return None

    def output_frames(self, window_tokens: int, last_chunk: bool) -> int:
        """Mel frames a window of `window_tokens` ids yields."""
        fresh = window_tokens if last_chunk else window_tokens - self.config.pre_lookahead_len
        return self.config.token_mel_ratio * max(fresh, 0)

    def _check_prompt(self, tokens: Tensor, mel: Tensor, spk: Tensor) -> None:
        config = self.config
        reason = FlowRejectReason.BAD_PROMPT
        if tokens.dim() != 1 or tokens.is_floating_point() or tokens.is_complex():
            raise FlowInputError(reason, "prompt_tokens must be a 1-D integer tensor")
        count = tokens.shape[0]
        if count < 1:
            raise FlowInputError(reason, "prompt_tokens is empty")
        _check_ids(tokens, config.vocab_size)
        frames = config.token_mel_ratio * count
        if tuple(mel.shape) != (frames, config.mel_dim) or not mel.is_floating_point():
            raise FlowInputError(
                reason, f"prompt_mel must be float ({frames}, {config.mel_dim}) for {count} tokens"
            )
        if tuple(spk.shape) != (config.spk_embed_dim,) or not spk.is_floating_point():
            raise FlowInputError(reason, f"spk_embedding must be float ({config.spk_embed_dim},)")
        self._check_capacity(cached_frames=0, new_frames=frames)

    def _check_batch(self, states: Sequence[FlowState], tokens: Tensor, last_chunk: bool) -> None:
        if not states:
            raise FlowInputError(FlowRejectReason.EMPTY_BATCH, "no states to decode")
        if tokens.dim() != 2 or tokens.shape[0] != len(states) or tokens.is_floating_point():
            raise FlowInputError(
                FlowRejectReason.TOKEN_SHAPE,
                f"tokens must be an integer (B={len(states)}, T) tensor, got {tuple(tokens.shape)}",
            )
        width = tokens.shape[1]
        if not last_chunk and width <= self.config.pre_lookahead_len:
            raise FlowInputError(
                FlowRejectReason.CHUNK_BELOW_LOOKAHEAD_WINDOW,
                f"a non-final window needs more than {self.config.pre_lookahead_len} ids, "
                f"got {width}",
            )
        _check_ids(tokens, self.config.vocab_size)
        self._check_states(states)
        fresh = self.output_frames(width, last_chunk)
        self._check_capacity(cached_frames=states[0].noise_offset, new_frames=fresh)

    def _check_states(self, states: Sequence[FlowState]) -> None:
        signature = states[0].shape_signature()
        if any(state.shape_signature() != signature for state in states[1:]):
            raise FlowInputError(
                FlowRejectReason.STATE_SIGNATURE_MISMATCH,
                "states in one batch must share prompt length, cache lengths, dtype and device",
            )
        if states[0].finished:
            raise FlowInputError(
                FlowRejectReason.STREAM_FINISHED, "a state cannot continue after its final window"
            )
        expected = self._state_shapes(states[0])
        if tuple(tuple(t.shape) for t in expected[0]) != expected[1]:
            raise FlowInputError(
                FlowRejectReason.STATE_SIGNATURE_MISMATCH,
                "the state was made by a flow of another configuration",
            )
        if states[0].spk.dtype != self.dtype:
            raise FlowInputError(
                FlowRejectReason.STATE_SIGNATURE_MISMATCH,
                f"state dtype {states[0].spk.dtype} differs from the model's {self.dtype}",
            )

    def _state_shapes(self, state: FlowState) -> tuple[list[Tensor], tuple[tuple[int, ...], ...]]:
        config = self.config
        frames_c = (
            state.conformer_att_cache.shape[2] if state.conformer_att_cache.dim() == 4 else -1
        )
        frames_e = state.noise_offset if state.estimator_att_cache.dim() == 6 else -1
        layers = config.encoder_blocks + config.encoder_up_blocks
        hidden, depth, steps = config.dit_hidden_size, config.dit_depth, config.n_timesteps
        shapes = (
            (config.input_size, 2 + 2 * config.token_mel_ratio),
            (layers, config.encoder_heads, frames_c, 2 * config.encoder_head_dim),
            (steps, depth, 2, 2 * hidden, 2),
            (steps, depth, 2, config.dit_heads, frames_e, 2 * config.dit_head_dim),
            (config.mel_dim,),
        )
        tensors = [
            state.conformer_cnn_cache,
            state.conformer_att_cache,
            state.estimator_cnn_cache,
            state.estimator_att_cache,
            state.spk,
        ]
        return tensors, shapes

    def _check_capacity(self, cached_frames: int, new_frames: int) -> None:
        config = self.config
        if cached_frames + new_frames > config.noise_frames:
            raise FlowInputError(
                FlowRejectReason.NOISE_CAPACITY,
                f"cache {cached_frames} + window {new_frames} frames exceed the noise table "
                f"({config.noise_frames} frames)",
            )
        if cached_frames + new_frames > config.max_relpos_frames:
            raise FlowInputError(
                FlowRejectReason.POSITION_CAPACITY,
                f"cache {cached_frames} + window {new_frames} frames exceed the rel-pos table "
                f"({config.max_relpos_frames} frames); the prompt is too long",
            )


def _check_ids(tokens: Tensor, vocab_size: int) -> None:
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise FlowInputError(
            FlowRejectReason.TOKEN_OUT_OF_RANGE, f"codec ids must be in [0, {vocab_size})"
        )


def initialise_parameters(module: nn.Module, seed: int) -> None:
    """Random weights from one seeded generator (uniform +-1/sqrt(fan_in), unit norms).

    Unlike upstream's DiT init, adaLN and the final layer are not zeroed, so an uncheckpointed
    model still exercises every path (a zeroed estimator would output pure noise).
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for sub in module.modules():
            _initialise(sub, generator)


def _initialise(sub: nn.Module, generator: torch.Generator) -> None:
    if isinstance(sub, nn.Embedding):
        sub.weight.normal_(generator=generator)
    elif isinstance(sub, nn.Linear | nn.Conv1d):
        bound = 1.0 / math.sqrt(sub.weight[0].numel())
        sub.weight.uniform_(-bound, bound, generator=generator)
        if sub.bias is not None:
            sub.bias.uniform_(-bound, bound, generator=generator)
    elif isinstance(sub, nn.LayerNorm) and sub.weight is not None:
        sub.weight.fill_(1.0)
        sub.bias.fill_(0.0)
    elif isinstance(sub, RelPositionAttention):
        bound = math.sqrt(6.0 / (sub.h + sub.d_k))  # xavier_uniform over (heads, d_k)
        sub.pos_bias_u.uniform_(-bound, bound, generator=generator)
        sub.pos_bias_v.uniform_(-bound, bound, generator=generator)
