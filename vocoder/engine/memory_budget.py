"""The memory budget of open streams: a stream state's peak bytes between windows, and the default
budget their charges must fit in (docs/vocoder.md, "Inside a decode_batch call")."""

from __future__ import annotations

import torch

from codeclog.vocoder.flow import FlowState
from codeclog.vocoder.hift.causal_stream import CausalVocoder
from codeclog.vocoder.hift.config import HiftConfig

# The open-stream state budget (consumers.stream.limit): on CUDA this share of the device memory
# free after the weights loaded (the rest is a decode batch's working memory and the allocator's
# slack); on the CPU a constant (about 40 full-size streams of 195.9 MB, or ~800k tiny ones).
CUDA_STATE_BUDGET_SHARE = 0.6
CPU_STATE_BUDGET_BYTES = 8 * 1024**3


def peak_state_bytes(
    flow: FlowState, att_keep_frames: int, hift: HiftConfig, causal: CausalVocoder | None
) -> int:
    """The peak of a stream that starts from the prompt state `flow`: both attention caches at
    prompt + att_keep_frames frames (they are trimmed back to that after every window) and full
    HiFT caches. A stream reaches it within a few windows."""
    frames = max(flow.noise_offset, flow.prompt_frames + att_keep_frames)
    fixed = flow.conformer_cnn_cache, flow.estimator_cnn_cache, flow.spk
    per_frame = sum(
        tensor.nbytes // max(1, tensor.shape[axis])
        for tensor, axis in ((flow.conformer_att_cache, 2), (flow.estimator_att_cache, 4))
    )
    return sum(int(t.nbytes) for t in fixed) + frames * per_frame + _peak_hift_bytes(hift, causal)


def _peak_hift_bytes(hift: HiftConfig, causal: CausalVocoder | None) -> int:
    """Scheme A: 8 mel frames, their excitation and held samples (float32). Scheme B (`causal`
    given): the bounded history plus the delay and one internal block, mel and excitation
    (float32), and the float64 phases."""
    if causal is not None:
        config, limits = causal.config, causal.limits
        frames = limits.history + limits.delay + config.block_frames
        values = frames * (config.in_channels + config.samples_per_frame)
        return 4 * values + 8 * (config.nb_harmonics + 1)
    return 4 * (hift.in_channels * hift.mel_cache_frames + 2 * hift.cache_samples)


def free_device_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA device now (None elsewhere)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def state_budget_bytes(device: torch.device, free_bytes_at_start: int | None) -> int:
    """The default memory budget of open stream states: on CUDA a share of the device memory
    that was free when the engine had loaded its weights (the rest is left to a decode batch's
    working memory); on the CPU a configured constant."""
    if device.type == "cuda" and free_bytes_at_start is not None:
        return int(free_bytes_at_start * CUDA_STATE_BUDGET_SHARE)
    return CPU_STATE_BUDGET_BYTES
