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

Both variables are read once, at the first launch, not on every call: the choice sits on
the hot path. ``refresh_backend()`` reads them again (after changing them at run time);
``set_backend(name)`` overrides the variable for this process (``None`` returns to it).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from ..errors import KernelInputError

ENV_VAR = "MM_SCHEDULE_KERNEL_BACKEND"
CHOICES = ("auto", "triton", "torch")


class Choice(NamedTuple):
    requested: str
    interpreted: bool
    has_triton: bool


_choice: Choice | None = None
_override: str | None = None


def requested_backend() -> str:
    value = _override or os.environ.get(ENV_VAR, "auto")
    value = value.strip().lower() or "auto"
    if value not in CHOICES:
        raise KernelInputError(f"{ENV_VAR}={value!r} is not one of {', '.join(CHOICES)}")
    return value


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "off")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def refresh_backend() -> Choice:
    """Read the environment again; the next launch uses the new choice."""
    global _choice
    _choice = Choice(requested_backend(), interpreter_enabled(), triton_available())
    return _choice


def set_backend(name: str | None) -> None:
    """Force ``auto``/``triton``/``torch`` for this process, or ``None`` to follow ``ENV_VAR``."""
    global _override
    if name is not None and name.strip().lower() not in CHOICES:
        raise KernelInputError(f"backend {name!r} is not one of {', '.join(CHOICES)}")
    _override = name
    refresh_backend()


def current_choice() -> Choice:
    return _choice or refresh_backend()


def uses_triton(device) -> bool:
    """True when a launch for ``device`` should run the Triton kernel (no checks; see
    ``select_backend`` for the checked form the public API uses)."""
    if device.type == "meta":  # a dry run: no data, nothing for a kernel to read
        return False
    requested, interpreted, has_triton = _choice or refresh_backend()
    if requested == "torch":
        return False
    if requested == "auto":
        return device.type != "cpu" and not interpreted and has_triton
    return True


def launches_kernels(device) -> bool:
    """``uses_triton`` for real devices; for ``meta`` (a dry run of a step), whether a GPU
    would run the Triton kernels: Triton installed and the backend not forced to torch. A
    dry run then does the host work of a launch (tables packed, uploads dispatched), which is
    what a GPU's host pays, and skips only the launch itself."""
    return launches_kernels_on(device.type)


def launches_kernels_on(device_type: str) -> bool:
    """``launches_kernels`` for a device of type ``device_type`` (``"cuda"``, ``"meta"``...)."""
    requested, interpreted, has_triton = _choice or refresh_backend()
    if not has_triton or requested == "torch":
        return False
    if device_type == "meta" or requested == "triton":
        return True
    return device_type != "cpu" and not interpreted


def select_backend(device) -> str:
    """Return ``"triton"`` or ``"torch"`` for tensors on ``device``; raise if forced
    Triton cannot run there."""
    requested, interpreted, has_triton = _choice or refresh_backend()
    if requested == "torch":
        return "torch"
    on_cpu = device.type == "cpu"
    if requested == "auto":
        if on_cpu or interpreted or not has_triton:
            return "torch"
        return "triton"
    if not has_triton:
        raise KernelInputError(
            f"{ENV_VAR}=triton but triton is not installed; install triton or unset {ENV_VAR}"
        )
    if on_cpu and not interpreted:
        raise KernelInputError(
            f"{ENV_VAR}=triton with CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
        )
    if not on_cpu and interpreted:
        raise KernelInputError(
            f"{ENV_VAR}=triton with TRITON_INTERPRET=1 only works for CPU tensors (the interpreter reads "
            f"table addresses on the host); tensors are on {device}"
        )
    return "triton"
