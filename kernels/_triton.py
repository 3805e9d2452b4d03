"""Triton, if installed, and the device helpers the kernels share.

The op modules define their ``@triton.jit`` kernels only when ``HAS_TRITON``; a CPU-only
install without triton still imports them and runs the torch references.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch references need neither
    triton = None
    tl = None

from .dtypes import dtype_name

HAS_TRITON = triton is not None


def tl_dtype(torch_dtype):
    """The ``tl`` dtype for a supported torch dtype (used as a constexpr)."""
    return getattr(tl, dtype_name(torch_dtype))


if HAS_TRITON:

    @triton.jit
    def cast_to(x, DST: tl.constexpr):
        """``x.to(DST)`` with round-to-nearest-even into bfloat16 spelled out in integer ops.

        GPUs round with ``cvt.rn``; the Triton interpreter truncates instead, which would
        make the CPU tests disagree with torch. The integer form is exact on both, and a
        few ALU ops are free in a kernel bound by memory bandwidth.
        """
        if DST == tl.bfloat16 and x.dtype != tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
            rounded = tl.where(x != x, 0x7FC0, rounded)  # NaN stays a quiet NaN
            return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            return x.to(DST)
else:
    cast_to = None
