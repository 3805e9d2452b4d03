"""Per-GPU launch configs: which ``BLOCK_M``/``BLOCK_H``/``num_warps``/``num_stages`` a
kernel uses for a given dtype, hidden size and row count on the GPU at hand.

Where configs come from, first match wins:

1. the folder named by ``MM_SCHEDULE_KERNEL_CONFIG_DIR`` (same layout as the shipped
   folder; a file there hides the shipped file for the same kernel and device),
2. the shipped folder ``kernels/configs/``,
3. ``launch_config.heuristic_config``, logged once per (kernel, device).

Inside each folder the file is ``<kernel>/<device>.json``, tried for each of the device's
names from ``device_names.device_candidates`` (product name, then architecture family).

A file (written by ``mm-schedule-tune``; see ``configs/README.md``)::

    {"kernel": "segment_gather", "device": "NVIDIA_H200", "source": "tuned",
     "triton_version": "3.9.0", "date": "...", "command": "mm-schedule-tune ...",
     "configs": {"bfloat16": {"4096": {"16": {...}, "1024": {...}}}}}

Lookup inside a file: the dtype must match exactly. The hidden size is the nearest tuned
one on a log scale, and only within a factor of two: tile widths tuned for H=4096 are a
fine guess for 3584, but not for 1152, where the heuristic (which sizes ``BLOCK_H`` from
H) is the better bet. The row count goes to the nearest tuned bucket on a log scale (4000
rows use the 4096 bucket rather than 1024, unlike vLLM's linear distance). Ties go to the
larger key.

Each file is read and checked once (``clear_cache`` forgets everything, e.g. after
writing new files in-process, including the launchers' resolved launches); answers are
cached per (kernel, dtype, hidden, rows, device, override folder).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelConfigError, KernelInputError
from .device_names import device_candidates
from .dtypes import dtype_name
from .launch_config import CONFIG_KEYS, heuristic_config, validate_config
from .registry import KERNEL_NAMES, kernel_entry

CONFIG_DIR_ENV = "MM_SCHEDULE_KERNEL_CONFIG_DIR"
SHIPPED_CONFIG_DIR = Path(__file__).resolve().parent / "configs"
HEADER_KEYS = ("kernel", "device", "triton_version", "date", "command", "source")
MAX_HIDDEN_RATIO = 2.0

logger = logging.getLogger(__name__)
_reported_misses: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class ConfigTable:
    """One parsed config file."""

    path: Path
    header: dict
    # dtype name -> hidden -> row bucket -> config
    configs: dict

    def lookup(self, dtype: str, hidden: int, n_rows: int) -> tuple[dict | None, str]:
        """The config for a shape, or ``None`` and the reason nothing fits."""
        by_hidden = self.configs.get(dtype)
        if not by_hidden:
            return None, f"{self.path} has no {dtype} entries (it has {sorted(self.configs)})"
        tuned_hidden = nearest_key(by_hidden, hidden)
        if max(tuned_hidden, hidden) / min(tuned_hidden, hidden) > MAX_HIDDEN_RATIO:
            return None, (
                f"{self.path} tunes {dtype} for hidden sizes {sorted(by_hidden)}, none within"
                f" {MAX_HIDDEN_RATIO:g}x of {hidden}"
            )
        by_rows = by_hidden[tuned_hidden]
        return by_rows[nearest_key(by_rows, max(n_rows, 1))], ""


def nearest_key(keys, value: int) -> int:
    """The key closest to ``value`` on a log2 scale; ties go to the larger key."""
    target = math.log2(value)
    return min(keys, key=lambda k: (abs(math.log2(k) - target), -k))


def config_dirs() -> tuple[Path, ...]:
    """Folders searched, highest priority first."""
    return _config_dirs(os.environ.get(CONFIG_DIR_ENV, "").strip())


@functools.lru_cache(maxsize=8)
def _config_dirs(override: str) -> tuple[Path, ...]:
    if not override:
        return (SHIPPED_CONFIG_DIR,)
    path = Path(override).expanduser()
    if not path.is_dir():
        raise KernelConfigError(
            f"{CONFIG_DIR_ENV}={override!r} is not a folder; unset it or create it"
        )
    return (path.resolve(), SHIPPED_CONFIG_DIR)


def get_config(kernel: str, *, dtype, hidden: int, n_rows: int, device=None) -> dict:
    """The launch config for ``kernel`` on ``device`` (default: the current GPU) for rows of
    ``hidden`` elements of ``dtype`` and ``n_rows`` rows in the launch. Returns a new dict
    with exactly ``launch_config.CONFIG_KEYS``."""
    kernel_entry(kernel)
    if not isinstance(hidden, int) or hidden <= 0:
        raise KernelInputError(f"hidden must be a positive int, got {hidden!r}")
    if not isinstance(n_rows, int) or n_rows < 0:
        raise KernelInputError(f"n_rows must be an int >= 0, got {n_rows!r}")
    config = _cached_config(kernel, dtype, hidden, n_rows, device_candidates(device), config_dirs())
    return dict(config)


@functools.lru_cache(maxsize=4096)
def _cached_config(kernel, dtype, hidden, n_rows, devices, dirs) -> dict:
    table = find_table(kernel, devices, dirs)
    if table is None:
        searched = ", ".join(str(d / kernel / f"{n}.json") for d in dirs for n in devices)
        reason = f"no config file (looked for {searched})"
    else:
        config, reason = table.lookup(dtype_name(dtype), hidden, n_rows)
        if config is not None:
            return config
    config = heuristic_config(kernel, dtype=dtype, hidden=hidden, n_rows=max(n_rows, 1))
    _report_miss(kernel, devices[0], reason, config)
    return config


def _report_miss(kernel: str, device: str, reason: str, config: dict) -> None:
    if (kernel, device) in _reported_misses:
        return
    _reported_misses.add((kernel, device))
    # Tuning only matters on a GPU; under the interpreter, or in a dry run on meta, this is routine.
    level = logging.INFO if device in ("cpu", "meta") else logging.WARNING
    logger.log(
        level,
        "%s on %s: no tuned config: %s; using the heuristic default (e.g. %s). Tune with"
        " `mm-schedule-tune --kernels %s --out DIR` and set %s=DIR.",
        kernel,
        device,
        reason,
        config,
        kernel,
        CONFIG_DIR_ENV,
    )


def find_table(kernel: str, devices: tuple[str, ...], dirs: tuple[Path, ...]) -> ConfigTable | None:
    """The first existing ``<dir>/<kernel>/<device>.json``, folders before device names."""
    for folder in dirs:
        for name in devices:
            path = folder / kernel / f"{name}.json"
            if path.is_file():
                table = load_table(path)
                if table.header["kernel"] != kernel:
                    raise KernelConfigError(
                        f"{path}: header says kernel {table.header['kernel']!r} but the file is filed"
                        f" under {kernel!r}"
                    )
                return table
    return None


@functools.cache
def load_table(path: Path) -> ConfigTable:
    """Read and check one config file; ``KernelConfigError`` naming the file and entry if
    anything is off."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KernelConfigError(f"{path}: cannot read kernel config file: {exc}") from exc
    return parse_table(data, path)


def parse_table(data, path: Path) -> ConfigTable:
    def fail(what: str):
        raise KernelConfigError(
            f"{path}: {what} (see {SHIPPED_CONFIG_DIR / 'README.md'} for the format)"
        )

    if not isinstance(data, dict):
        fail(f"expected a JSON object, got {type(data).__name__}")
    for key in HEADER_KEYS:
        if not isinstance(data.get(key), str) or not data[key]:
            fail(f"header field {key!r} is missing or not a non-empty string")
    if data["kernel"] not in KERNEL_NAMES:
        fail(f"kernel {data['kernel']!r} is not one of {KERNEL_NAMES}")
    raw = data.get("configs")
    if not isinstance(raw, dict) or not raw:
        fail("'configs' must be a non-empty object: dtype -> hidden -> rows -> config")
    configs = {}
    for dtype, by_hidden in raw.items():
        if not isinstance(by_hidden, dict) or not by_hidden:
            fail(f"configs[{dtype!r}] must be a non-empty object keyed by hidden size")
        configs[dtype] = {}
        for hidden, by_rows in by_hidden.items():
            where = f"configs[{dtype!r}][{hidden!r}]"
            h = _positive_int_key(hidden, where, fail)
            if not isinstance(by_rows, dict) or not by_rows:
                fail(f"{where} must be a non-empty object keyed by row count")
            configs[dtype][h] = {}
            for rows, config in by_rows.items():
                entry = f"{where}[{rows!r}]"
                configs[dtype][h][_positive_int_key(rows, entry, fail)] = _checked_config(
                    config, entry, fail
                )
    _note_triton_version(data["triton_version"], path)
    return ConfigTable(path=Path(path), header={k: data[k] for k in HEADER_KEYS}, configs=configs)


def _positive_int_key(key: str, where: str, fail) -> int:
    if not key.isdigit() or int(key) <= 0:
        fail(f"{where}: key must be a positive integer, got {key!r}")
    return int(key)


def _checked_config(config, where: str, fail) -> dict:
    if not isinstance(config, dict):
        fail(f"{where} must be a config object, got {type(config).__name__}")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        fail(f"{where}: unknown keys {unknown}; a config has exactly {list(CONFIG_KEYS)}")
    if any(type(v) is not int for v in config.values()):
        fail(f"{where}: values must be integers, got {config}")
    try:
        return validate_config(config)
    except KernelInputError as exc:
        fail(f"{where}: {exc}")


def _note_triton_version(file_version: str, path: Path) -> None:
    """Warn when a file was tuned with another Triton minor version: code generation (and
    so the best tile) changes between releases, as SGLang observed from 3.1 to 3.2."""
    try:
        import triton
    except ImportError:
        return
    if file_version.split(".")[:2] != triton.__version__.split(".")[:2]:
        logger.warning(
            "%s was tuned with Triton %s, running %s; the configs still apply but may no longer be"
            " the fastest (re-run mm-schedule-tune)",
            path,
            file_version,
            triton.__version__,
        )


def iter_configs(folder: Path | None = None):
    """Yield ``(kernel, device, dtype, hidden, rows, config)`` for every entry of every file
    in ``folder`` (default: the shipped folder), e.g. to compile each ahead of time."""
    folder = Path(folder) if folder is not None else SHIPPED_CONFIG_DIR
    for path in sorted(folder.glob("*/*.json")):
        table = load_table(path)
        for dtype, by_hidden in table.configs.items():
            for hidden, by_rows in by_hidden.items():
                for rows, config in by_rows.items():
                    yield table.header["kernel"], path.stem, dtype, hidden, rows, dict(config)


# Caches elsewhere that hold resolved configs (the launchers' per-shape launches): a
# launcher registers its clearing function here, since this module cannot import it.
_dependent_caches: list = []


def on_clear(clear) -> None:
    """Have ``clear_cache`` also call ``clear`` (a launcher's cache of resolved configs)."""
    if clear not in _dependent_caches:
        _dependent_caches.append(clear)


def clear_cache() -> None:
    """Forget parsed files, cached answers, which misses were already logged, and every
    launch resolved from them (``on_clear``): the next launch reads the files again."""
    load_table.cache_clear()
    _config_dirs.cache_clear()
    _cached_config.cache_clear()
    _reported_misses.clear()
    for clear in _dependent_caches:
        clear()


def resolve_config(
    kernel: str, *, dtype, hidden: int, n_rows: int, device, config: dict | None = None
) -> dict:
    """What a launcher runs: the caller's config if given, else the tuned one for this GPU,
    else the heuristic."""
    if config is not None:
        return validate_config(config)
    return validate_config(
        get_config(kernel, dtype=dtype, hidden=hidden, n_rows=n_rows, device=device)
    )
