"""What the engine refuses before anything computes: every item (`WindowRules.check`), then
every group (`flow_refused`), each a `WindowRejectedError` with a stable reason
(docs/vocoder.md, "Inside a decode_batch call")."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

from codeclog.vocoder.engine.stream_state import StreamState
from codeclog.vocoder.errors import VocoderInputError

DecodeItem = tuple[StreamState, Sequence[int], bool]


class WindowRejectReason(enum.Enum):
    """Why the engine refused an item. Stable values: they go to dead letters and metrics."""

    EMPTY_WINDOW = "empty_window"
    TOKEN_OUT_OF_RANGE = "token_out_of_range"
    CHUNK_BELOW_LOOKAHEAD_WINDOW = "chunk_below_lookahead_window"
    STREAM_FINISHED = "stream_finished"
    FOREIGN_STATE = "foreign_state"  # not a StreamState of an engine of these sizes
    FLOW_REFUSED = "flow_refused"  # the flow's own checks (e.g. prompt + cache over capacity)


class WindowRejectedError(VocoderInputError):
    """An item of a decode_batch call is refused; no state changed.

    item_index: the first refused item; item_indices: every item refused for the same cause
    (several only for FLOW_REFUSED, which refuses a whole group of equal-shape items).
    """

    def __init__(
        self,
        item_index: int,
        reason: WindowRejectReason,
        message: str,
        item_indices: tuple[int, ...] = (),
    ) -> None:
        super().__init__(f"item {item_index}: {reason.value}: {message}")
        self.item_index = item_index
        self.item_indices = item_indices or (item_index,)
        self.reason = reason


def flow_refused(item_indices: tuple[int, ...], message: str) -> WindowRejectedError:
    """The flow refused these items (its capacity checks) before computing any of them."""
    return WindowRejectedError(
        item_indices[0], WindowRejectReason.FLOW_REFUSED, message, item_indices
    )


@dataclasses.dataclass(frozen=True)
class Window:
    """One checked item: its position in the call, its state, its ids."""

    index: int
    state: StreamState
    ids: tuple[int, ...]
    final: bool


@dataclasses.dataclass(frozen=True)
class WindowRules:
    """What an engine accepts: codec ids 0 .. vocab_size - 1, a non-final window longer than
    its `lookahead` ids, and only states of its own HiFT variant and sizes."""

    vocab_size: int
    lookahead: int
    mel_dim: int  # the flow's: a state's speaker vector has this size
    hift_channels: int  # the HiFT's mel bins: a state's held mel has this many rows
    hift_variant: str  # "causal" or "noncausal", as StreamState.hift_variant says

    def check(self, index: int, item: DecodeItem) -> Window:
        """Item `index` as a Window, or the WindowRejectedError that refuses it."""
        state, ids, final = item
        if not isinstance(state, StreamState):
            raise WindowRejectedError(index, WindowRejectReason.FOREIGN_STATE, "not a StreamState")
        if state.finished:
            raise WindowRejectedError(
                index, WindowRejectReason.STREAM_FINISHED, "the stream already ended"
            )
        window = tuple(int(i) for i in ids)
        self._check_ids(index, window, bool(final))
        if state.hift_variant != self.hift_variant:
            raise WindowRejectedError(
                index,
                WindowRejectReason.FOREIGN_STATE,
                f"state of a {state.hift_variant} HiFT engine, this engine's HiFT is "
                f"{self.hift_variant}",
            )
        if state.flow.spk.shape != (self.mel_dim,) or state.hift_mel.shape[0] != (
            self.hift_channels
        ):
            raise WindowRejectedError(
                index, WindowRejectReason.FOREIGN_STATE, "state from an engine of other sizes"
            )
        return Window(index, state, window, bool(final))

    def _check_ids(self, index: int, window: tuple[int, ...], final: bool) -> None:
        if not window:
            raise WindowRejectedError(index, WindowRejectReason.EMPTY_WINDOW, "no codec ids")
        vocab = self.vocab_size
        if min(window) < 0 or max(window) >= vocab:
            raise WindowRejectedError(
                index, WindowRejectReason.TOKEN_OUT_OF_RANGE, f"codec ids must be in 0..{vocab - 1}"
            )
        lookahead = self.lookahead
        if not final and len(window) <= lookahead:
            raise WindowRejectedError(
                index,
                WindowRejectReason.CHUNK_BELOW_LOOKAHEAD_WINDOW,
                f"a non-final window needs at least {lookahead + 1} ids, got {len(window)}",
            )
