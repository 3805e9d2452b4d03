"""Triton, if installed, and the device helpers the kernels share.

The op modules define their ``@triton.jit`` kernels only when ``HAS_TRITON``; a CPU-only
install without triton still imports them and runs the torch references.
"""

from __future__ import annotations

import os

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


def _interpreted() -> bool:
    # Read once, like triton itself: the decorators below already chose interpreter or compiler.
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off")


def _interpreter_index_fix() -> None:
    """Triton's interpreter before 3.9 turns a scalar (a one-element array) into a loop
    bound with ``int(array)``, which NumPy 2.4 refuses for arrays of one dimension: every
    kernel whose loop bound is an argument fails. Convert through ``squeeze`` as Triton
    3.9 does; later versions are left alone."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "index_fixed", False):
        return

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch.index_fixed = True
    interpreter._patch_lang_tensor = patch


if HAS_TRITON and _interpreted() and tuple(map(int, triton.__version__.split(".")[:2])) < (3, 9):
    _interpreter_index_fix()

if HAS_TRITON:
    # The interpreter's bfloat16 conversions are not the hardware's: float32 -> bfloat16
    # truncates, and bfloat16 -> float32 flushes subnormals. Compiled code converts
    # natively (cvt.rn.bf16.f32 on sm_80+, v_cvt_pk_bf16_f32 on gfx950, Triton's short
    # integer sequence on gfx942), so only the interpreter gets these exact bit-level forms.
    _EMULATE_BF16 = tl.constexpr(_interpreted())

    @triton.jit
    def cast_to(x, DST: tl.constexpr):
        """``x.to(DST)``, rounding to nearest even when narrowing, NaN staying NaN."""
        if _EMULATE_BF16 and x.dtype == tl.bfloat16 and DST != tl.bfloat16:
            # Widening is a 16-bit shift: exact for every value, subnormals included.
            wide = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            return wide.to(DST)
        elif _EMULATE_BF16 and DST == tl.bfloat16 and x.dtype != tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
            rounded = tl.where(x != x, 0x7FC0, rounded)  # NaN stays a quiet NaN
            return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            return x.to(DST)  # Triton's default for narrowing floats is round-to-nearest-even
else:
    cast_to = None
