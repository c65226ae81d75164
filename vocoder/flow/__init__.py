"""The Token2wav flow (tokens -> 50 Hz mel): native, config-sized, with explicit batched state;
this face hands on its public API (docs/vocoder.md, "The flow")."""

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
