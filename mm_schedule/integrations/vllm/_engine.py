"""The pieces of mm_schedule this integration runs on, imported in this one place.

The segment table type and the trusted one-launch copy (Triton on GPUs, torch or the
package's C byte copy on the CPU) come from the scheduler's assembly and the kernels;
the errors from the project's error module; ``plain_rows`` is how the scheduler turns
a negated or strided view into rows that may be copied as bytes.
"""

from ...assemble import SegmentTable, one_dtype
from ...errors import EmbeddingLengthMismatch, InvalidItemError, KernelInputError, MMScheduleError
from ...kernels.segment_copy.trusted import copy_segments
from ...validate import plain_rows

__all__ = [
    "EmbeddingLengthMismatch",
    "InvalidItemError",
    "KernelInputError",
    "MMScheduleError",
    "SegmentTable",
    "copy_segments",
    "one_dtype",
    "plain_rows",
]
