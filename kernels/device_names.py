"""The names under which per-GPU kernel configs are filed.

A config file is ``configs/<kernel>/<name>.json``; a device is looked up under a short,
ordered list of names, most specific first:

- NVIDIA: the name ``torch.cuda.get_device_name`` reports with spaces turned into
  underscores, exactly the spelling vLLM and SGLang use for their tuned MoE tables
  (``NVIDIA_H200``, ``NVIDIA_H100_80GB_HBM3``, ``NVIDIA_A100-SXM4-80GB``), then the
  compute-capability family (``sm_90``). SKUs are never merged by guessing: an
  ``NVIDIA_H100_PCIe`` (2.0 TB/s) is not an ``NVIDIA_H100_80GB_HBM3`` (3.35 TB/s).
- AMD: the product name the same way (``AMD_Instinct_MI300X``), then the gfx architecture
  from ``gcnArchName`` with its feature suffixes removed (``gfx942:sramecc+:xnack-`` ->
  ``gfx942``). ROCm sometimes reports a name that identifies no product (``AMD Radeon
  Graphics``, an empty string); such a name is skipped so that an unrelated card's file
  is never picked, and the architecture decides.
- Anything else (``cpu`` under the Triton interpreter, ``xpu``...): the device type.

The functions taking raw strings are pure so they can be tested without a GPU; only
``device_candidates`` talks to torch.
"""

from __future__ import annotations

import functools
import re

_GFX_ARCH = re.compile(r"gfx[0-9a-f]{3,5}")
# Names ROCm reports for more than one product; filing a config under them would apply
# one card's measurements to another.
_GENERIC_AMD_NAMES = frozenset(
    {"", "AMD_Radeon_Graphics", "AMD_Instinct", "AMD_Radeon", "AMD_Graphics"}
)
_FILE_UNSAFE = re.compile(r"[/\\\x00]")


def normalize_device_name(raw: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"NVIDIA_H100_80GB_HBM3"``; hyphens and case kept.

    Path separators become underscores too, because the result is a file name.
    """
    return _FILE_UNSAFE.sub("_", raw.strip().replace(" ", "_"))


def gfx_arch(gcn_arch_name: str) -> str | None:
    """The gfx family of a ROCm ``gcnArchName`` (``"gfx942:sramecc+:xnack-"`` ->
    ``"gfx942"``), or ``None`` when the string is not a gfx architecture."""
    base = gcn_arch_name.strip().split(":", 1)[0].lower()
    return base if _GFX_ARCH.fullmatch(base) else None


def nvidia_candidates(name: str, capability: tuple[int, int] | None = None) -> tuple[str, ...]:
    """Lookup names for an NVIDIA GPU: the normalised product name, then ``sm_<major><minor>``."""
    names = [normalize_device_name(name)]
    if capability is not None:
        major, minor = capability
        names.append(f"sm_{major}{minor}")
    return _ordered(names)


def amd_candidates(name: str, gcn_arch_name: str = "") -> tuple[str, ...]:
    """Lookup names for an AMD GPU: the product name unless it is generic, then the gfx arch."""
    names = []
    product = normalize_device_name(name)
    if product not in _GENERIC_AMD_NAMES:
        names.append(product)
    arch = gfx_arch(gcn_arch_name)
    if arch is not None:
        names.append(arch)
    return _ordered(names)


def _ordered(names) -> tuple[str, ...]:
    """Drop empty and repeated names, keeping the first occurrence's place."""
    return tuple(dict.fromkeys(n for n in names if n))


def device_candidates(device=None) -> tuple[str, ...]:
    """Lookup names for ``device`` (a ``torch.device``, a string, an index, or ``None`` for
    the current CUDA/ROCm device, or ``cpu`` when there is none), most specific first.
    Never empty."""
    import torch

    if device is None:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else "cpu"
        )
    elif isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device)
    if device.type != "cuda":
        return (device.type,)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _gpu_candidates(index)


@functools.cache
def _gpu_candidates(index: int) -> tuple[str, ...]:
    import torch

    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        names = amd_candidates(props.name, getattr(props, "gcnArchName", ""))
    else:
        names = nvidia_candidates(props.name, (props.major, props.minor))
    # A nameless GPU still gets a lookup name (its device type), so callers need no special case.
    return names or ("cuda",)
