"""The element types the Triton kernels take: every fact about them in one table.

Pure Python (no torch, no triton), so the config lookup, the tuner's argument parsing
and the AOT tooling read it without loading either. A dtype may be given as a torch
dtype (``torch.bfloat16``), its name (``"bfloat16"``) or torch's spelling of it
(``"torch.bfloat16"``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import KernelInputError

# Bytes of one vector access; the aligned variants move rows in units of this.
VECTOR_BYTES = 16


@dataclass(frozen=True)
class KernelDtype:
    name: str  # torch's attribute name, also the key in the tuned config tables
    short: str  # Triton's spelling in a kernel signature ("*bf16")
    itemsize: int

    @property
    def vector_elements(self) -> int:
        """Elements in one 16-byte vector access."""
        return VECTOR_BYTES // self.itemsize


KERNEL_DTYPES = {
    d.name: d
    for d in (
        KernelDtype("bfloat16", "bf16", 2),
        KernelDtype("float16", "fp16", 2),
        KernelDtype("float32", "fp32", 4),
    )
}
SUPPORTED_DTYPES = tuple(KERNEL_DTYPES)


def dtype_name(dtype) -> str:
    """``torch.bfloat16``, ``"torch.bfloat16"`` or ``"bfloat16"`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def kernel_dtype(dtype, what: str = "tensor") -> KernelDtype:
    """The table entry for ``dtype``; ``KernelInputError`` naming ``what`` if the kernels
    do not take it."""
    entry = KERNEL_DTYPES.get(dtype_name(dtype))
    if entry is None:
        raise KernelInputError(
            f"{what} has dtype {dtype}; the Triton kernels take {', '.join(SUPPORTED_DTYPES)}"
            " (set MM_SCHEDULE_KERNEL_BACKEND=torch for other dtypes)"
        )
    return entry


def vector_width(*itemsizes: int) -> int:
    """Elements per 16-byte access of the narrowest dtype involved: the divisibility of
    the row length the aligned variants need."""
    return VECTOR_BYTES // min(itemsizes)
