"""Which implementation runs an op: the Triton kernel or the plain-torch reference.

``MM_SCHEDULE_KERNEL_BACKEND`` chooses:

- ``auto`` (default): Triton for tensors on a CUDA or ROCm device (torch calls both
  ``cuda``), the torch reference for CPU tensors.
- ``triton``: always Triton. CPU tensors then need ``TRITON_INTERPRET=1`` (the Triton
  interpreter runs the kernel on the host); that is how the test-suite checks the kernels
  without a GPU.
- ``torch``: always the torch reference (one ``copy_`` per segment on a GPU: correct,
  slower, and a useful baseline when a kernel is suspected).

The interpreter dereferences the raw addresses stored in our pointer tables on the host,
so it can only ever run on CPU tensors; GPU tensors under ``TRITON_INTERPRET=1`` fall back
to torch in ``auto`` mode and are refused in ``triton`` mode.
"""

from __future__ import annotations

import functools
import os

from ..errors import KernelInputError

ENV_VAR = "MM_SCHEDULE_KERNEL_BACKEND"
CHOICES = ("auto", "triton", "torch")


def requested_backend() -> str:
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise KernelInputError(f"{ENV_VAR}={value!r} is not one of {', '.join(CHOICES)}")
    return value


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off")


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def select_backend(device) -> str:
    """Return ``"triton"`` or ``"torch"`` for tensors on ``device``; raise if forced
    Triton cannot run there."""
    requested = requested_backend()
    if requested == "torch":
        return "torch"
    on_cpu = device.type == "cpu"
    if requested == "auto":
        if on_cpu or interpreter_enabled() or not triton_available():
            return "torch"
        return "triton"
    if not triton_available():
        raise KernelInputError(
            f"{ENV_VAR}=triton but triton is not installed; install triton or unset {ENV_VAR}"
        )
    if on_cpu and not interpreter_enabled():
        raise KernelInputError(
            f"{ENV_VAR}=triton with CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
        )
    if not on_cpu and interpreter_enabled():
        raise KernelInputError(
            f"{ENV_VAR}=triton with TRITON_INTERPRET=1 only works for CPU tensors (the interpreter reads "
            f"table addresses on the host); tensors are on {device}"
        )
    return "triton"
