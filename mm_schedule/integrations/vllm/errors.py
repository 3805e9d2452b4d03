"""Errors of the vLLM integration; each subclasses the project's base error and the
builtin that vLLM itself raises in the same situation, so existing handlers keep working."""

from __future__ import annotations

from ...errors import (
    EmbeddingLengthMismatch,
    InvalidItemError,
    KernelInputError,
    MMScheduleError,
    SegmentError,
)

# The project's errors this integration raises too, importable with its own.
__all__ = ["EmbeddingLengthMismatch", "EncoderCacheMiss", "InvalidItemError", "KernelInputError", "MMScheduleError",
           "SegmentError", "UnsupportedVLLMRelease"]


class EncoderCacheMiss(MMScheduleError, RuntimeError):
    """A scheduled placeholder range needs an encoder output that the store does not hold
    (vLLM raises ``RuntimeError("Encoder cache miss ...")`` here)."""

    def __init__(self, *, request: str, mm_hash: str, offset: int, length: int) -> None:
        self.request = request
        self.mm_hash = mm_hash
        super().__init__(
            f"request {request!r}: encoder cache miss for mm_hash {mm_hash!r} (placeholder range offset"
            f" {offset}, length {length}); the encoder output must be in the store before its rows are"
            " gathered (was it encoded this step, or freed too early?)"
        )


class UnsupportedVLLMRelease(MMScheduleError, RuntimeError):
    """The installed vLLM is not a release this integration was compared with, and its
    own gather and merge could not be verified against ours where it runs."""
