"""The streaming Code2Wav engine: codec-id windows in, 24 kHz audio out, state explicit; this
face hands on the consumer's API (docs/vocoder.md, "Using the engine")."""

from codeclog.vocoder.engine.code2wav import Code2WavEngine
from codeclog.vocoder.engine.window_checks import WindowRejectedError, WindowRejectReason
from codeclog.vocoder.errors import VocoderInputError
from codeclog.vocoder.shared import pcm_s16le, stream_seed
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
