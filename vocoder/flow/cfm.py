"""Conditional flow matching: cosine schedule, Euler solver, classifier-free guidance, upstream's
operation by operation for B requests at once (docs/vocoder.md, "The flow")."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from codeclog.vocoder.flow.config import FlowConfig
from codeclog.vocoder.flow.dit import DiT, TimeConditioning
from codeclog.vocoder.flow.parallel import MIN_ROW_MACS, RowThreads, estimate_in_parts
from codeclog.vocoder.flow.rows import ChunkRows
from codeclog.vocoder.kernels import portable_active
from codeclog.vocoder.kernels.factories import box_muller


def draw_noise_table(config: FlowConfig) -> Tensor:
    """The (1, mel_dim, noise_frames) float32 CPU table. Native torch.randn: its Box-Muller
    rounds differently by CPU (vectorised on AVX2, scalar libm elsewhere); under portable
    kernels the same draws give the same bits everywhere (see PortableNoise)."""
    generator = torch.Generator(device="cpu").manual_seed(config.noise_seed)
    return torch.randn([1, config.mel_dim, config.noise_frames], generator=generator)


class PortableNoise:
    """The portable noise table, transformed only where read.

    torch's CPU randn fills the whole table with uniform draws and turns each block of 16
    consecutive values into normals on its own (Box-Muller), so a slice needs only its blocks.
    With noise_frames a multiple of 16, blocks never straddle mel bins; then the (cheap, exact)
    uniform draws are kept and a slice's blocks transformed on demand, which is what makes the
    portable table affordable (2.4 M values, of which a stream reads a few thousand)."""

    def __init__(self, config: FlowConfig) -> None:
        if config.noise_frames % 16:
            raise ValueError("PortableNoise needs noise_frames divisible by 16")
        generator = torch.Generator(device="cpu").manual_seed(config.noise_seed)
        count = config.mel_dim * config.noise_frames
        uniform = torch.rand(count, generator=generator, dtype=torch.float32)
        self._uniform = uniform.view(config.mel_dim, config.noise_frames)
        self._blocks: dict[int, Tensor] = {}  # block start frame -> (mel_dim, 16) normals

    def slice(self, offset: int, frames: int) -> Tensor:
        """noise[:, :, offset : offset + frames] of the table randn would have drawn."""
        first, last = offset // 16, -(-(offset + frames) // 16)
        blocks = [self._block(index * 16) for index in range(first, last)]
        if not blocks:
            return self._uniform[None, :, :0].clone()
        joined = torch.cat(blocks, dim=1)
        start = offset - first * 16
        return joined[None, :, start : start + frames]

    def _block(self, start: int) -> Tensor:
        block = self._blocks.get(start)
        if block is None:
            uniform = self._uniform[:, start : start + 16].to(torch.float64)
            block = box_muller(uniform.reshape(-1)).reshape(-1, 16).to(torch.float32)
            self._blocks[start] = block
        return block


def cosine_t_span(n_timesteps: int, like: Tensor) -> Tensor:
    t_span = torch.linspace(0, 1, n_timesteps + 1, device=like.device, dtype=like.dtype)
    return 1 - torch.cos(t_span * 0.5 * torch.pi)


def euler_steps(t_span: Tensor) -> list[tuple[Tensor, Tensor]]:
    """(t (1,), dt) of every Euler step over `t_span`, in upstream's arithmetic: t starts at
    t_span[0] and advances by dt; dt is re-aimed at the next point of the span after each step."""
    t, dt = t_span[0].unsqueeze(dim=0), t_span[1] - t_span[0]
    steps = []
    for step in range(1, len(t_span)):
        steps.append((t, dt))
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return steps


class ConditionalFlowMatching(nn.Module):
    """Holds the estimator (so its weights are `decoder.estimator.*`) and the noise table."""

    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        self.config = config
        self.estimator = DiT(config)
        self.register_buffer("noise", torch.empty(0), persistent=False)
        self._portable_noise: PortableNoise | None = None
        self._conditioning: tuple[tuple[object, ...], list[TimeConditioning]] | None = None

    def fill_buffers(self) -> None:
        weight = self.estimator.in_proj.weight
        if portable_active() and self.config.noise_frames % 16 == 0:
            self._portable_noise = PortableNoise(self.config)
            self.noise = torch.empty(0, device=weight.device, dtype=weight.dtype)
            return
        self._portable_noise = None
        self.noise = draw_noise_table(self.config).to(device=weight.device, dtype=weight.dtype)

    def noise_slice(self, offset: int, frames: int) -> Tensor:
        if self._portable_noise is None:
            return self.noise[:, :, offset : offset + frames]
        weight = self.estimator.in_proj.weight
        return self._portable_noise.slice(offset, frames).to(weight.device, weight.dtype)

    def forward_chunk(
        self,
        mu: Tensor,
        spks: Tensor,
        cond: Tensor,
        cnn_cache: Tensor | None,
        att_cache: Tensor | None,
        threads: RowThreads | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """mu, cond (B, mel, F); spks (B, mel) -> mel (B, mel, F), new cnn and att caches.
        `threads`: estimate the rows in parts side by side (vocoder.flow.parallel)."""
        offset = att_cache.shape[4] if att_cache is not None else 0
        frames = mu.shape[2]
        z = self.noise_slice(offset, frames) * 1.0  # upstream: * temperature (1.0)
        x = z.expand(mu.shape[0], -1, -1)
        return self.solve(x, mu, spks, cond, cnn_cache, att_cache, threads=threads)

    def solve(
        self,
        x: Tensor,
        mu: Tensor,
        spks: Tensor,
        cond: Tensor,
        cnn_cache: Tensor | None,
        att_cache: Tensor | None,
        rows: ChunkRows | None = None,
        threads: RowThreads | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The Euler solve from the noise x (B, mel, F) over the cosine schedule, classifier-free
        guided; `rows`: a ragged batch's key mask and row ends over the 2B estimator rows (the
        caller pads and cuts the caches; vocoder.flow.ragged); `threads` (equal rows only): the
        estimator's rows in parts side by side. Returns forward_chunk's triple."""
        steps = euler_steps(cosine_t_span(self.config.n_timesteps, mu))
        conditioning = self.conditioning([t for t, _ in steps])
        rate = self.config.inference_cfg_rate
        count, frames = 2 * mu.shape[0], mu.shape[2]
        cached = att_cache.shape[4] if att_cache is not None else 0
        mu_in = torch.cat([mu, torch.zeros_like(mu)], dim=0)
        spks_in = torch.cat([spks, torch.zeros_like(spks)], dim=0)
        cond_in = torch.cat([cond, torch.zeros_like(cond)], dim=0)
        new_att = mu.new_empty(
            (len(steps), *self.estimator.att_cache_shape(count, frames + cached))
        )
        new_cnn = []
        split = (
            threads is not None
            and rows is None
            and len(threads.parts(count)) > 1
            and self.estimator.row_macs(frames) >= MIN_ROW_MACS
        )
        for step, (_, dt) in enumerate(steps, start=1):
            inputs = (
                torch.cat([x, x], dim=0),
                mu_in,
                conditioning[step - 1],
                spks_in,
                cond_in,
                cnn_cache[step - 1] if cnn_cache is not None else None,
                att_cache[step - 1] if att_cache is not None else None,
                new_att[step - 1],
            )
            if split:
                assert threads is not None
                dphi_dt, step_cnn = estimate_in_parts(
                    self.estimator.forward_chunk, threads, *inputs
                )
            else:
                dphi_dt, step_cnn = self.estimator.forward_chunk(*inputs, rows)
            new_cnn.append(step_cnn)
            dphi_dt, cfg_dphi_dt = dphi_dt.chunk(2, dim=0)
            dphi_dt = (1.0 + rate) * dphi_dt - rate * cfg_dphi_dt
            x = x + dt * dphi_dt
        return x, torch.stack(new_cnn, dim=0), new_att

    def conditioning(self, times: Sequence[Tensor]) -> list[TimeConditioning]:
        """The estimator's `condition` at every step's time. Every window steps through the
        same times, so they are kept while the weights, dtype, device and kernels are the same
        (not while autograd records: then computed afresh)."""
        estimator = self.estimator
        if torch.is_grad_enabled():  # kept tensors are inference tensors: never in a graph
            return [estimator.condition(t) for t in times]
        key = (
            len(times),
            times[0].dtype,
            times[0].device,
            portable_active(),
            tuple((id(p), p._version) for p in estimator.condition_parameters()),
        )
        if self._conditioning is not None and self._conditioning[0] == key:
            return self._conditioning[1]
        computed = [estimator.condition(t) for t in times]
        self._conditioning = (key, computed)
        return computed
