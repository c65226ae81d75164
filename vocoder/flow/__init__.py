"""The Token2wav flow (tokens -> 50 Hz mel): native, config-sized, with explicit batched state.

Public API (the vocoder interface contract):
- `FlowConfig` (`tiny()`, `full()`, `from_yaml(path)`), `ConformerTrim`;
- `Token2WavFlow(config)`: `prepare_prompt(...) -> FlowState`,
  `decode_chunk_batch(states, tokens, last_chunk) -> (mel, states)`;
- `FlowState`: `shape_signature()`, `to_bytes()` / `from_bytes()`, `nbytes`;
- errors: `FlowInputError` (a `VocoderInputError`, with a `FlowRejectReason`),
  `FlowConfigError`, `FlowStateError`;
- `canonical_windows(tokens)`: the 25 + 3 window schedule.
"""

from codeclog.vocoder.flow.config import ConformerTrim, FlowConfig
from codeclog.vocoder.flow.errors import (
    FlowConfigError,
    FlowInputError,
    FlowRejectReason,
    FlowStateError,
)
from codeclog.vocoder.flow.model import Token2WavFlow
from codeclog.vocoder.flow.state import FlowState
from codeclog.vocoder.flow.windows import canonical_windows

__all__ = [
    "ConformerTrim",
    "FlowConfig",
    "FlowConfigError",
    "FlowInputError",
    "FlowRejectReason",
    "FlowState",
    "FlowStateError",
    "Token2WavFlow",
    "canonical_windows",
]
