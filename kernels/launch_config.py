"""Launch configurations: the contract between the kernels and the per-GPU config tables.

A config is a dict with exactly these keys:

- ``BLOCK_M``: rows per program (the work-split tile; every segment is cut into tiles of
  at most this many rows, one program each),
- ``BLOCK_H``: hidden columns per inner-loop step,
- ``num_warps``, ``num_stages``: passed to the Triton launch.

Which kernel a config is for, and what its ``n_rows`` counts, is in ``registry.py``.
A config is used as given for the aligned variant; the unaligned one runs
``unaligned_config(config)``. The launchers call ``tuned_configs.resolve_config``: the
caller's config, else the tuned table for this GPU, else ``heuristic_config`` from here
(this module imports neither ``tuned_configs`` nor the kernels: the chain runs one way,
launch_config <- tuned_configs <- launchers).
"""

from __future__ import annotations

from ..errors import KernelInputError
from .dtypes import vector_width
from .registry import kernel_entry

CONFIG_KEYS = ("BLOCK_M", "BLOCK_H", "num_warps", "num_stages")
_WAVE64 = 64  # lanes per warp on CDNA; sizing for it is also safe for 32-lane NVIDIA warps


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _is_pow2(n) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


# Programs a launch should have before its tiles grow taller: two per compute unit on the
# largest GPUs the kernels target (304 CUs on MI300X/MI325X), almost four per SM on a
# 132-SM H100/H200. A copy is latency-bound below one program per SM.
TARGET_PROGRAMS = 512
MAX_BLOCK_M = 16


def _prev_pow2(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def heuristic_config(kernel: str, *, dtype, hidden: int, n_rows: int) -> dict:
    """A config that is sound everywhere: up to 16 KiB moved per program per inner step,
    tiles only as tall as keeps ``TARGET_PROGRAMS`` programs for the rows at hand (1,024
    rows run 2-row tiles: 512 programs), no more warps than the tile fills with full
    16-byte vectors (counting 64-lane AMD waves), and a ``BLOCK_H`` no wider than the row
    (a power of two dividing it when one at least half as wide does), so that a full
    tile runs every step but the last of an odd row length unmasked."""
    kernel_entry(kernel)
    itemsize = getattr(dtype, "itemsize", 2)
    vec = vector_width(itemsize)
    block_m = min(MAX_BLOCK_M, _prev_pow2(max(1, n_rows // TARGET_PROGRAMS)))
    # No wider than the row, so that a full tile's steps but the last run unmasked.
    block_h = min(_prev_pow2(max(hidden, 16)), 8192 // itemsize, max(64, 16384 // (block_m * itemsize)))
    divisor = hidden & -hidden  # the largest power of two dividing the row length
    if hidden % block_h and divisor >= max(64, block_h // 2):
        block_h = divisor
    block_m = max(block_m, (vec * _WAVE64) // block_h)
    num_warps = max(1, min(4, block_m * block_h // (vec * _WAVE64)))
    return {"BLOCK_M": block_m, "BLOCK_H": block_h, "num_warps": num_warps, "num_stages": 1}


def row_bucket(n_rows: int) -> int:
    """The power of two nearest to ``n_rows`` on a log scale (at least 1): launch configs
    and compiled-launch handles are looked up per bucket, so a new image size reuses
    the launch of its bucket instead of resolving and compiling one of its own."""
    if n_rows <= 1:
        return 1
    low = _prev_pow2(n_rows)
    # Nearer to 2*low than to low on a log scale: n_rows**2 >= low * 2*low.
    return low * 2 if n_rows * n_rows >= 2 * low * low else low


def unaligned_config(config: dict) -> dict:
    """The config the unaligned variant runs with: each element then needs its own address
    registers, so ``BLOCK_H`` shrinks until a lane holds at most four of them (the fused
    lookup reads two rows per element; more spills registers on 64-lane AMD waves). Tile height, and thus the table, is unchanged."""
    lanes = config["num_warps"] * _WAVE64
    block_h = config["BLOCK_H"]
    while block_h > 16 and config["BLOCK_M"] * block_h > 4 * lanes:
        block_h //= 2
    return {**config, "BLOCK_H": block_h}


def validate_config(config: dict) -> dict:
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise KernelInputError(f"kernel config {config!r} lacks keys {missing}")
    for key in ("BLOCK_M", "BLOCK_H", "num_warps"):
        if not _is_pow2(config[key]):
            raise KernelInputError(
                f"kernel config {key}={config[key]!r} must be a positive power of two"
            )
    if not isinstance(config["num_stages"], int) or config["num_stages"] < 1:
        raise KernelInputError(
            f"kernel config num_stages={config['num_stages']!r} must be an int >= 1"
        )
    return {k: config[k] for k in CONFIG_KEYS}
