"""What the tuner searches: the shapes it times and the launch configs it tries per shape.

Holds the default shape lists and search spaces, the parsers for the ``--shapes``,
``--configs``, ``--hidden`` and ``--rows`` arguments (bad text raises
``KernelConfigError`` naming the argument), and ``prune``, which drops the configs that
cannot be good for a shape before anything is timed. Pure Python: no torch, no device.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

from ...errors import KernelConfigError, KernelInputError
from ..dtypes import SUPPORTED_DTYPES as DTYPES
from ..launch_config import CONFIG_KEYS, validate_config

DEFAULT_DTYPES = ("bfloat16", "float16")
# Language-model hidden sizes of common VLMs (SigLIP-sized Gemma up to 70B-class).
DEFAULT_HIDDEN = (1152, 2048, 2560, 3584, 4096, 5120, 8192)
# Rows per launch: one small image up to a long chunk of many images.
DEFAULT_ROWS = (16, 64, 256, 1024, 4096, 16384)
FULL_SPACE = {
    "BLOCK_M": (1, 2, 4, 8, 16, 32),
    "BLOCK_H": (128, 256, 512, 1024, 2048, 4096),
    "num_warps": (2, 4, 8),
    "num_stages": (1,),
}
QUICK_SPACE = {"BLOCK_M": (4, 16), "BLOCK_H": (512, 2048), "num_warps": (4, 8), "num_stages": (1,)}
# Tile bytes per thread kept by the search-space pruning: at least one 16-byte vector,
# at most what fits in registers without spilling on either vendor.
MIN_BYTES_PER_THREAD, MAX_BYTES_PER_THREAD = 16, 256


@dataclass(frozen=True)
class Shape:
    dtype: str
    hidden: int
    n_rows: int

    def __str__(self) -> str:
        return f"{self.dtype} H={self.hidden} rows={self.n_rows}"


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def grid(space: dict) -> list[dict]:
    """Every combination of the values in ``space`` (one tuple per key of ``CONFIG_KEYS``)."""
    keys = list(CONFIG_KEYS)
    return [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]


def prune(configs: list[dict], shape: Shape, itemsize: int, warp_size: int) -> list[dict]:
    """Drop configs that cannot be good for ``shape``: tiles wider than the row or taller
    than the launch, and tiles too small or too large per thread."""
    kept = []
    for cfg in configs:
        per_thread = cfg["BLOCK_M"] * cfg["BLOCK_H"] * itemsize / (cfg["num_warps"] * warp_size)
        if cfg["BLOCK_H"] > _next_pow2(shape.hidden) or cfg["BLOCK_M"] > _next_pow2(shape.n_rows):
            continue
        if MIN_BYTES_PER_THREAD <= per_thread <= MAX_BYTES_PER_THREAD:
            kept.append(cfg)
    return kept


def parse_config_space(text: str) -> list[dict]:
    """``'[{"BLOCK_M": 4, ...}, ...]'`` (JSON) or ``'BLOCK_M=4,8;BLOCK_H=64;num_warps=1;num_stages=1'`` (a grid)."""
    text = text.strip()
    if text.startswith("["):
        try:
            configs = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KernelConfigError(f"--configs is not valid JSON: {exc}") from exc
        if not isinstance(configs, list) or not all(isinstance(c, dict) for c in configs):
            raise KernelConfigError("--configs JSON must be a list of config objects")
    else:
        space = {}
        for part in filter(None, (p.strip() for p in text.split(";"))):
            key, sep, values = part.partition("=")
            if not sep or key.strip() not in CONFIG_KEYS:
                raise KernelConfigError(
                    f"--configs: {part!r} is not KEY=V1,V2 with KEY one of {list(CONFIG_KEYS)}"
                )
            try:
                space[key.strip()] = tuple(int(v) for v in values.split(","))
            except ValueError as exc:
                raise KernelConfigError(
                    f"--configs: {part!r} has a value that is not an integer"
                ) from exc
        missing = [k for k in CONFIG_KEYS if k not in space]
        if missing:
            raise KernelConfigError(f"--configs grid lacks {missing}")
        configs = grid(space)
    if not configs:
        raise KernelConfigError("--configs is empty")
    try:
        return [validate_config(c) for c in configs]
    except KernelInputError as exc:
        raise KernelConfigError(f"--configs: {exc}") from exc


def parse_shapes(text: str) -> list[Shape]:
    """``'bfloat16:4096:1024,float16:64:16'`` -> shapes."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        fields = part.split(":")
        if (
            len(fields) != 3
            or fields[0] not in DTYPES
            or not (fields[1].isdigit() and fields[2].isdigit())
        ):
            raise KernelConfigError(
                f"--shapes: {part!r} is not DTYPE:HIDDEN:ROWS with DTYPE one of {DTYPES}"
            )
        hidden, rows = int(fields[1]), int(fields[2])
        if hidden <= 0 or rows <= 0:
            raise KernelConfigError(
                f"--shapes: {part!r} needs a positive hidden size and row count"
            )
        shapes.append(Shape(fields[0], hidden, rows))
    if not shapes:
        raise KernelConfigError("--shapes is empty")
    return shapes


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """``'16,64'`` -> ``(16, 64)``; ``what`` names the argument in the error."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise KernelConfigError(
            f"{what}: {text!r} is not a comma-separated list of integers"
        ) from exc
    if not values or min(values) <= 0:
        raise KernelConfigError(f"{what}: needs positive integers, got {text!r}")
    return values
