"""Voices: the prompt features a stream is conditioned on.

A voice is what upstream's `_prepare_prompt` computes from a reference recording: the prompt's
codec ids (S3Tokenizer, 25 Hz), its 24 kHz log-mel at 50 Hz (2 frames per id) and a 192-d
CAMPPlus speaker vector. The engine runs the flow over it once per voice (`prepare_prompt`) and
shares that initial state between every stream of the voice.

`default_voice` builds deterministic features from a fixed seed, so the engine works with no
reference audio and no ONNX models (tests, the tiny fixture, demos). With real weights it gives
a valid but arbitrary timbre; real voices come from a voice file (`save_voice` / `load_voice`)
holding features computed where the reference tokenizer and speaker model are available.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from codeclog.vocoder.errors import VocoderConfigError, VocoderInputError

DEFAULT_VOICE_SEED = 20250101  # fixed forever: changing it changes every default-voice golden
DEFAULT_PROMPT_TOKENS = 50  # 2 s of prompt (100 mel frames)
DEFAULT_MEL_MEAN = -6.0  # a quiet, plausible natural-log mel level
DEFAULT_MEL_STD = 1.5


class VoiceSizes(Protocol):
    """The sizes a voice must match (a FlowConfig has them)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def mel_dim(self) -> int: ...

    @property
    def spk_embed_dim(self) -> int: ...

    @property
    def token_mel_ratio(self) -> int: ...


@dataclasses.dataclass(frozen=True, eq=False)
class Voice:
    """Prompt features of one voice (CPU tensors, never mutated)."""

    voice_id: str  # names the voice in logs and in the engine's prompt cache
    prompt_tokens: Tensor  # (Tp,) int64 codec ids of the reference
    prompt_mel: Tensor  # (ratio * Tp, mel_dim) float32 log-mel of the reference, 50 Hz
    spk_embedding: Tensor  # (spk_embed_dim,) float32 speaker vector (normalised by the flow)

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 of the features: two voices with one id but other features never collide."""
        digest = hashlib.sha256(self.voice_id.encode())
        for tensor in (self.prompt_tokens, self.prompt_mel, self.spk_embedding):
            flat = tensor.detach().to("cpu").contiguous()
            digest.update(str((flat.dtype, tuple(flat.shape))).encode())
            digest.update(flat.reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def check(self, sizes: VoiceSizes) -> None:
        """Raise VocoderInputError unless the features fit a flow of these sizes."""
        count = int(self.prompt_tokens.shape[0]) if self.prompt_tokens.dim() == 1 else -1
        if count < 1 or self.prompt_tokens.is_floating_point():
            raise VocoderInputError(f"voice {self.voice_id}: prompt_tokens must be 1-D ids")
        if int(self.prompt_tokens.min()) < 0 or int(self.prompt_tokens.max()) >= sizes.vocab_size:
            raise VocoderInputError(f"voice {self.voice_id}: prompt id out of range")
        mel_shape = (sizes.token_mel_ratio * count, sizes.mel_dim)
        if tuple(self.prompt_mel.shape) != mel_shape:
            raise VocoderInputError(f"voice {self.voice_id}: prompt_mel must be {mel_shape}")
        if tuple(self.spk_embedding.shape) != (sizes.spk_embed_dim,):
            raise VocoderInputError(
                f"voice {self.voice_id}: spk_embedding must be ({sizes.spk_embed_dim},)"
            )


def default_voice(sizes: VoiceSizes, prompt_tokens: int = DEFAULT_PROMPT_TOKENS) -> Voice:
    """Deterministic prompt features from DEFAULT_VOICE_SEED: same sizes, same voice, anywhere."""
    if prompt_tokens < 1:
        raise VocoderConfigError("a default voice needs at least one prompt token")
    generator = torch.Generator(device="cpu").manual_seed(DEFAULT_VOICE_SEED)
    tokens = torch.randint(0, sizes.vocab_size, (prompt_tokens,), generator=generator)
    frames = sizes.token_mel_ratio * prompt_tokens
    noise = torch.randn(frames, sizes.mel_dim, generator=generator)
    mel = DEFAULT_MEL_MEAN + DEFAULT_MEL_STD * noise
    spk = torch.randn(sizes.spk_embed_dim, generator=generator)
    return Voice(f"default-{prompt_tokens}", tokens, mel, spk)


VOICE_FILE_FORMAT = "codeclog.voice.v1"


def save_voice(voice: Voice, path: str | Path) -> None:
    """Write a voice file (safetensors: the three features, the id in the metadata)."""
    from safetensors.torch import save_file  # the vocoder extra; imported where needed

    tensors = {
        "prompt_tokens": voice.prompt_tokens.to(torch.int64).contiguous(),
        "prompt_mel": voice.prompt_mel.to(torch.float32).contiguous(),
        "spk_embedding": voice.spk_embedding.to(torch.float32).contiguous(),
    }
    metadata = {"format": VOICE_FILE_FORMAT, "voice_id": voice.voice_id}
    save_file(tensors, str(path), metadata=metadata)


def load_voice(path: str | Path) -> Voice:
    """Read a voice file written by `save_voice`."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except (OSError, ValueError) as exc:  # safetensors raises its own subclasses of these
        raise VocoderConfigError(f"cannot read voice file {path}: {exc}") from exc
    if metadata.get("format") != VOICE_FILE_FORMAT:
        raise VocoderConfigError(f"{path} is not a codeclog voice file ({json.dumps(metadata)})")
    missing = {"prompt_tokens", "prompt_mel", "spk_embedding"} - set(tensors)
    if missing:
        raise VocoderConfigError(f"voice file {path} lacks {', '.join(sorted(missing))}")
    return Voice(
        metadata.get("voice_id") or Path(path).stem,
        tensors["prompt_tokens"],
        tensors["prompt_mel"],
        tensors["spk_embedding"],
    )
