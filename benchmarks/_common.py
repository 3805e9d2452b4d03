"""Measurement helpers shared by the benchmark scripts in this folder.

Nothing here knows about segments or embeddings: it records the environment, times
host calls, counts host syncs, measures transient device memory and writes tables. Device
time comes from ``mm_schedule.kernels.tools.timing.GpuTimer``, the timer the tuner uses. On a CPU every
device-only measurement returns ``None`` so a caller can print "n/a" instead of a
made-up number.
"""

from __future__ import annotations

import datetime as _dt
import platform
import re
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence

import torch

from mm_schedule.kernels.tools.timing import MiB, l2_bytes

# -- environment ------------------------------------------------------------------------


def is_gpu(device: torch.device) -> bool:
    return device.type == "cuda"


def backend_name() -> str:
    if not torch.cuda.is_available():
        return "cpu"
    return "rocm" if torch.version.hip else "cuda"


def device_name(device: torch.device) -> str:
    if is_gpu(device):
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def file_label(name: str) -> str:
    """A device name as it may appear in a file name (spaces and odd characters to '_')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip()).strip("_") or "unknown"


def environment(device: torch.device) -> dict:
    """What a result file must record so a reader can reproduce or distrust it."""
    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        # "python" rather than this machine's interpreter path; the versions are recorded apart.
        "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "device": device_name(device),
        "backend": backend_name() if is_gpu(device) else "cpu",
    }
    if is_gpu(device):
        props = torch.cuda.get_device_properties(device)
        info["multiprocessors"] = props.multi_processor_count
        info["memory_gib"] = round(props.total_memory / 1024**3, 1)
        info["l2_mib"] = round(l2_bytes(device) / MiB, 1)
        if torch.version.hip:
            info["hip"] = torch.version.hip
            info["arch"] = getattr(props, "gcnArchName", "?")
        else:
            info["cuda"] = torch.version.cuda
            info["arch"] = f"sm_{props.major}{props.minor}"
    return info


def _triton_version() -> str:
    try:
        import triton
    except Exception as exc:  # an ImportError, or a broken install raising anything
        return f"unavailable ({type(exc).__name__})"
    return triton.__version__


# -- correctness ------------------------------------------------------------------------

_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN poison compares by its bits, -0.0 differs from 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    as_int = _SAME_WIDTH_INT[a.element_size()]
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


# -- timing -----------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if is_gpu(device):
        torch.cuda.synchronize(device)


def wall_us_per_call(run: Callable[[int], object], calls: int, device: torch.device) -> float:
    """Host wall time per call of back-to-back calls, launch overhead included.

    ``run(i)`` performs call ``i`` (the caller rotates its buffers with ``i``).
    """
    synchronize(device)
    start = time.perf_counter()
    for i in range(calls):
        run(i)
    synchronize(device)
    return (time.perf_counter() - start) / calls * 1e6


def cpu_times_us(run: Callable[[int], object], repeats: int) -> list[float]:
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        run(i)
        times.append((time.perf_counter() - start) * 1e6)
    return times


# -- host syncs and memory --------------------------------------------------------------


def count_host_syncs(run: Callable[[], object], device: torch.device) -> int | None:
    """Number of synchronising CUDA/HIP calls torch makes while ``run()`` executes.

    Uses ``torch.cuda.set_sync_debug_mode("warn")``: every torch code path that
    blocks the host on the device (stream/device/event synchronize, ``.item()``,
    ``nonzero``, boolean indexing, blocking copies between host and device) reports
    through one hook, which then issues a warning that is caught and counted here.
    Kernel launches made outside torch (Triton's launcher) never synchronise.
    """
    if not is_gpu(device):
        return None
    synchronize(device)
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    synchronize(device)
    return sum(1 for w in caught if "synchroniz" in str(w.message))


def transient_bytes(
    run: Callable[[], object], device: torch.device, preexisting: Sequence[torch.Tensor] = ()
) -> int | None:
    """Peak device memory a call allocates beyond its own new output.

    A result that is one of ``preexisting`` (an in-place write) counts as no new
    output; any other returned tensor is the output and is not charged.
    """
    if not is_gpu(device):
        return None
    synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = run()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    output = 0
    if isinstance(result, torch.Tensor) and all(
        result.data_ptr() != t.data_ptr() for t in preexisting
    ):
        output = result.untyped_storage().nbytes()
    del result
    return max(peak - base - output, 0)


# -- reporting --------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    if n < 1024:
        return f"{n} B"
    if n < MiB:
        return f"{n / 1024:.1f} KiB"
    return f"{n / MiB:.1f} MiB"
