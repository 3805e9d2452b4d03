"""``mm-schedule-tune``: time every launch config of the kernels on this GPU and write the
per-device config files that ``tuned_configs.get_config`` reads.

For each kernel and shape (dtype, hidden, rows per launch) every config of the search
space, plus the heuristic default, is

1. planned through the kernel's public launcher with an explicit ``config=``,
2. checked: one launch into a poisoned destination must match the torch reference bit
   for bit (a config that is fast because it is wrong must never win). This first launch
   also compiles the config; it happens for every config of a shape before any is timed
   and does not count against ``--max-seconds``,
3. timed (``timing.GpuTimer.graph_us``): one CUDA graph replays the launch over several
   distinct buffer sets (together larger than L2 when memory allows), a scratch buffer
   larger than the caches is overwritten before every replay, and the median replay time
   divided by the launches in it is kept. Under ``TRITON_INTERPRET=1`` on CPU (to test
   the tuner itself) wall time per launch is taken instead, which says nothing about any
   GPU.

The fastest config per shape goes to ``<out>/<kernel>/<device>.json``, rewritten after
every shape, so a run that is stopped keeps every shape it finished. ``--max-seconds``
caps the timed work (checked before every config); shapes not reached are listed in the
report. Point ``MM_SCHEDULE_KERNEL_CONFIG_DIR`` at ``<out>`` to use the files, or copy
them into ``kernels/configs/`` to ship them. Example (and ``--help``)::

    mm-schedule-tune --out tuned --quick
    TRITON_INTERPRET=1 mm-schedule-tune --shapes bfloat16:64:16 --configs 'BLOCK_M=4,8;BLOCK_H=64;num_warps=1;num_stages=1'

The shapes and search space are in ``space``, the per-kernel cases in ``cases``, the
timers in ``timing``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import KernelConfigError, KernelInputError
from ..backend import ENV_VAR as BACKEND_ENV
from ..backend import interpreter_enabled, refresh_backend
from ..device_names import device_candidates, normalize_device_name
from ..launch_config import heuristic_config
from ..registry import KERNEL_NAMES, kernel_entry
from ..tuned_configs import CONFIG_DIR_ENV
from .cases import buffer_sets
from .space import (
    DEFAULT_DTYPES,
    DEFAULT_HIDDEN,
    DEFAULT_ROWS,
    DTYPES,
    FULL_SPACE,
    QUICK_SPACE,
    Shape,
    grid,
    parse_config_space,
    parse_int_list,
    parse_shapes,
    prune,
)
from .timing import Budget, GpuTimer, cold_cache_bytes, wall_us_per_launch


class TunerError(RuntimeError):
    """The tuner cannot run here (no GPU and no interpreter, or a kernel without a tuning case)."""


@dataclass
class Timing:
    config: dict
    us: float | None = None  # per launch; None when the config failed
    error: str | None = None


@dataclass
class ShapeResult:
    kernel: str
    shape: Shape
    heuristic: dict
    timings: list[Timing] = field(default_factory=list)

    @property
    def ok(self) -> list[Timing]:
        return sorted((t for t in self.timings if t.us is not None), key=lambda t: t.us)

    @property
    def best(self) -> Timing | None:
        ok = self.ok
        return ok[0] if ok else None

    @property
    def heuristic_us(self) -> float | None:
        return next((t.us for t in self.timings if t.config == self.heuristic), None)


SKIPPED = "skipped: time cap reached"


@dataclass
class TuningReport:
    device: str
    method: str
    results: list[ShapeResult]
    files: dict[str, Path]
    not_reached: list[tuple[str, Shape]] = field(default_factory=list)
    compile_s: float = 0.0  # first launches (compile + check), outside the time cap

    @property
    def wrong(self) -> list[tuple[str, Shape, Timing]]:
        return [
            (r.kernel, r.shape, t)
            for r in self.results
            for t in r.timings
            if t.error and t.error.startswith("wrong result")
        ]

    def timing_rows(self) -> list[dict]:
        """Every timing and failure, one row each (what ``--timings`` writes)."""
        return [
            {
                "kernel": r.kernel,
                "dtype": r.shape.dtype,
                "hidden": r.shape.hidden,
                "n_rows": r.shape.n_rows,
                "config": t.config,
                "us": t.us,
                "error": t.error,
                "heuristic": t.config == r.heuristic,
            }
            for r in self.results
            for t in r.timings
        ]


@contextlib.contextmanager
def _forced_triton_backend():
    """The tuner times the Triton kernels, whatever the caller's backend choice."""
    previous = os.environ.get(BACKEND_ENV)
    os.environ[BACKEND_ENV] = "triton"
    refresh_backend()
    try:
        yield
    finally:
        if previous is None:
            del os.environ[BACKEND_ENV]
        else:
            os.environ[BACKEND_ENV] = previous
        refresh_backend()


def _device():
    import torch

    if interpreter_enabled():
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    raise TunerError(
        "no CUDA or ROCm GPU here; run on the GPU to tune, or set TRITON_INTERPRET=1 to exercise the"
        " tuner on CPU (its timings then describe the interpreter, not a GPU)"
    )


def _warp_size(device) -> int:
    import torch

    if device.type == "cuda" and torch.version.hip:
        arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "")
        return 64 if arch.startswith("gfx9") else 32  # CDNA wave64, RDNA wave32
    return 32


def tune(
    kernels: list[str],
    shapes: list[Shape],
    *,
    configs: list[dict] | None = None,
    quick: bool = False,
    out: Path,
    device_name: str | None = None,
    item_rows: int = 576,
    reps: int | None = None,
    warmup: int | None = None,
    flush_mib: int = 512,
    command: str = "",
    budget: Budget | None = None,
    timings_path: Path | None = None,
    log: Callable[[str], None] = lambda msg: None,
) -> TuningReport:
    """Time the config space for every kernel and shape and return every timing. The
    winners go to ``out/<kernel>/<device>.json`` (and every timing to ``timings_path``)
    after each shape; ``budget`` stops the run between configs."""
    import torch

    for kernel in kernels:
        if kernel not in KERNEL_NAMES:
            raise TunerError(f"no tuning case for kernel {kernel!r}; the tuner knows {KERNEL_NAMES}")
    budget = budget or Budget()
    device = _device()
    device_name = (
        normalize_device_name(device_name) if device_name else device_candidates(device)[0]
    )
    on_gpu = device.type == "cuda"
    reps = reps or (20 if on_gpu else 2)
    warmup = (3 if on_gpu else 0) if warmup is None else warmup
    if on_gpu:
        gpu_timer = GpuTimer(device, flush_bytes=flush_mib << 20)
        cold_bytes = 2 * cold_cache_bytes(device)

        def measure(launches):
            return gpu_timer.graph_us(launches, replays=reps, warmup=warmup)

        method = "cuda-graph"
        how = (
            f"CUDA-graph replay of one launch per buffer set (sets totalling >= {cold_bytes >> 20}"
            f" MiB where memory allows), {flush_mib} MiB scratch overwritten before each replay;"
            f" median of {reps} replays after {warmup}"
        )
    else:
        cold_bytes = 0

        def measure(launches):
            return wall_us_per_launch(launches, reps=reps, warmup=warmup)

        method = "wall-clock (interpreter)"
        how = (
            f"TRITON_INTERPRET=1 on CPU, wall clock per launch over 2 sets; median of {reps}"
            " rounds. Not a GPU measurement"
        )
    header = _header(device, device_name, how, command)
    report = TuningReport(device=device_name, method=method, results=[], files={})
    warp_size = _warp_size(device)
    todo = [(kernel, shape) for kernel in kernels for shape in shapes]
    with _forced_triton_backend():
        for index, (kernel, shape) in enumerate(todo):
            if budget.exceeded():
                report.not_reached = todo[index:]
                log(f"time cap reached: {len(todo) - index} (kernel, shape) pairs not tuned")
                break
            result = _tune_shape(
                kernel, shape, device, configs, quick, measure, budget, cold_bytes, warp_size,
                item_rows,
            )  # fmt: skip
            report.results.append(result)
            log(_summary(result))
            report.files = _write_files(report.results, out, device_name, header)
            if timings_path is not None:
                _write_json(Path(timings_path), report.timing_rows())
            if on_gpu:
                torch.cuda.empty_cache()
    report.compile_s = budget.untimed_s
    return report


def _tune_shape(
    kernel, shape, device, configs, quick, measure, budget, cold_bytes, warp_size, item_rows
) -> ShapeResult:
    import torch

    itemsize = getattr(torch, shape.dtype).itemsize
    heuristic = heuristic_config(
        kernel, dtype=getattr(torch, shape.dtype), hidden=shape.hidden, n_rows=shape.n_rows
    )
    if configs is None:
        space = grid(QUICK_SPACE if quick else FULL_SPACE)
        configs = prune(space, shape, itemsize, warp_size)
    candidates = [heuristic] + [c for c in configs if c != heuristic]
    n_sets = buffer_sets(shape, itemsize, device, cold_bytes)
    kernel_entry(kernel)
    from .cases import CASES

    case_class = CASES[kernel]
    case = case_class(shape, device, n_sets, item_rows, seed=hash((kernel, shape)) & 0xFFFF)
    result = ShapeResult(kernel=kernel, shape=shape, heuristic=heuristic)
    result.timings = [Timing(config=dict(config)) for config in candidates]
    # First launches compile; they all happen before any timing, outside the time cap.
    with budget.untimed():
        for timing in result.timings:
            if budget.exceeded():
                timing.error = SKIPPED
                continue
            timing.error = _attempt(lambda t=timing: case.check(t.config))
    for timing in result.timings:
        if timing.error is not None:
            continue
        if budget.exceeded():
            timing.error = SKIPPED
            continue
        launches = [case.launcher(buffers, timing.config) for buffers in case.sets]
        timing.error = _attempt(lambda t=timing, ls=launches: setattr(t, "us", measure(ls)))
    return result


def _attempt(step) -> str | None:
    """Run ``step``; a config the compiler or the GPU rejects only drops out."""
    try:
        return step()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _summary(result: ShapeResult) -> str:
    best, failed = result.best, sum(t.us is None and t.error != SKIPPED for t in result.timings)
    skipped = sum(t.error == SKIPPED for t in result.timings)
    head = f"{result.kernel} {result.shape}: "
    if best is None and skipped:
        return head + f"not timed ({skipped} configs skipped at the time cap)"
    if best is None:
        return head + f"all {len(result.timings)} configs failed, e.g. {result.timings[0].error}"
    ratio = (
        f", heuristic {result.heuristic_us:.2f} us ({result.heuristic_us / best.us:.2f}x)"
        if result.heuristic_us
        else ""
    )
    return (
        head
        + f"best {best.config} {best.us:.2f} us{ratio}; {len(result.timings)} configs, {failed} failed"
        + (f", {skipped} skipped at the time cap" if skipped else "")
    )


def _header(device, device_name: str, timing: str, command: str) -> dict:
    import torch
    import triton

    raw = torch.cuda.get_device_properties(device).name if device.type == "cuda" else device.type
    return {
        "device": device_name,
        "device_reported": raw,
        "lookup_names": list(device_candidates(device)),
        "source": "tuned",
        "triton_version": triton.__version__,
        "torch_version": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "timing": timing,
    }


def _write_files(
    results: list[ShapeResult], out: Path, device_name: str, header: dict
) -> dict[str, Path]:
    files = {}
    for kernel in dict.fromkeys(r.kernel for r in results):
        configs, timings = {}, {}
        for r in results:
            if r.kernel != kernel or r.best is None:
                continue
            key = (r.shape.dtype, str(r.shape.hidden), str(r.shape.n_rows))
            _nested(configs, key, r.best.config)
            _nested(
                timings,
                key,
                {
                    "best": round(r.best.us, 3),
                    "heuristic": r.heuristic_us and round(r.heuristic_us, 3),
                    "configs": len(r.ok),
                },
            )
        if not configs:
            continue
        doc = {"kernel": kernel, **header, "configs": configs, "timings_us": timings}
        path = Path(out) / kernel / f"{device_name}.json"
        _replace_file(path, _dump(doc) + "\n")
        files[kernel] = path
    return files


def _write_json(path: Path, obj) -> None:
    _replace_file(path, json.dumps(obj, indent=1) + "\n")


def _replace_file(path: Path, text: str) -> None:
    """Write through a temporary file, so a reader (or a run killed mid-write) never sees
    half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _nested(tree: dict, key: tuple[str, ...], value) -> None:
    for part in key[:-1]:
        tree = tree.setdefault(part, {})
    tree[key[-1]] = value


def _dump(obj, indent: int = 0) -> str:
    """JSON with one line per leaf object, so a config reads as one line in a diff."""
    if not isinstance(obj, dict) or all(not isinstance(v, dict) for v in obj.values()):
        return json.dumps(obj)
    pad = "  " * (indent + 1)
    body = ",\n".join(f"{pad}{json.dumps(k)}: {_dump(v, indent + 1)}" for k, v in obj.items())
    return "{\n" + body + "\n" + "  " * indent + "}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mm-schedule-tune",
        description="Time the launch configs of the mm_schedule kernels on this GPU and write"
        " <out>/<kernel>/<device>.json for MM_SCHEDULE_KERNEL_CONFIG_DIR (or kernels/configs/).",
    )
    p.add_argument(
        "--kernels", default=",".join(KERNEL_NAMES), help="comma-separated (default: %(default)s)"
    )
    p.add_argument(
        "--dtypes", default=",".join(DEFAULT_DTYPES), help="comma-separated (default: %(default)s)"
    )
    p.add_argument(
        "--hidden",
        default=",".join(map(str, DEFAULT_HIDDEN)),
        help="hidden sizes (default: %(default)s)",
    )
    p.add_argument(
        "--rows",
        default=",".join(map(str, DEFAULT_ROWS)),
        help="rows per launch (default: %(default)s)",
    )
    p.add_argument(
        "--shapes", help="explicit DTYPE:HIDDEN:ROWS list; replaces --dtypes/--hidden/--rows"
    )
    space = p.add_mutually_exclusive_group()
    space.add_argument(
        "--quick", action="store_true", help="a small search space (8 configs before pruning)"
    )
    space.add_argument(
        "--configs",
        help="the configs to time, unpruned (the heuristic default is always timed too): a JSON list,"
        " or a grid 'BLOCK_M=4,8;BLOCK_H=...;num_warps=...;num_stages=...'",
    )
    p.add_argument(
        "--out", default="mm_schedule_tuned", help="output folder (default: %(default)s)"
    )
    p.add_argument(
        "--device-name", help="file name to write under (default: this device's most specific name)"
    )
    p.add_argument(
        "--item-rows",
        type=int,
        default=576,
        help="rows per multimodal item in the timed tables (default: %(default)s)",
    )
    p.add_argument(
        "--reps", type=int, help="timed repetitions (default: 20 on GPU, 2 under the interpreter)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        help="untimed repetitions (default: 3 on GPU, 0 under the interpreter)",
    )
    p.add_argument(
        "--flush-mib",
        type=int,
        default=512,
        help="cache-flush scratch size on GPU (default: %(default)s)",
    )
    p.add_argument(
        "--timings", help="also write every timing (and every failure) to this JSON file"
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        help="stop timing after this many seconds, compiles not counted (default: no cap);"
        " files are written after every shape either way",
    )
    return p


def run(argv: list[str] | None = None) -> TuningReport:
    """Parse ``argv``, tune, write the files; return the report (what ``main`` prints)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if args.shapes:
        shapes = parse_shapes(args.shapes)
    else:
        dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        bad = [d for d in dtypes if d not in DTYPES]
        if bad or not dtypes:
            raise KernelConfigError(f"--dtypes: {bad or dtypes} not among {DTYPES}")
        hidden, rows = parse_int_list(args.hidden, "--hidden"), parse_int_list(args.rows, "--rows")
        shapes = [Shape(d, h, r) for d in dtypes for h in hidden for r in rows]
    if args.item_rows <= 0 or (args.reps is not None and args.reps <= 0) or args.flush_mib < 0:
        raise KernelConfigError("--item-rows and --reps must be positive, --flush-mib not negative")
    if args.warmup is not None and args.warmup < 0:
        raise KernelConfigError("--warmup must not be negative")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise KernelConfigError("--max-seconds must be positive")
    return tune(
        kernels,
        shapes,
        configs=parse_config_space(args.configs) if args.configs else None,
        quick=args.quick,
        out=Path(args.out),
        device_name=args.device_name,
        item_rows=args.item_rows,
        reps=args.reps,
        warmup=args.warmup,
        flush_mib=args.flush_mib,
        command=shlex.join(["mm-schedule-tune", *argv]),
        budget=Budget(timed_s=args.max_seconds),
        timings_path=Path(args.timings) if args.timings else None,
        log=lambda msg: print(msg, file=sys.stderr, flush=True),
    )


def main(argv: list[str] | None = None) -> int:
    try:
        report = run(argv)
    except (TunerError, KernelConfigError, KernelInputError) as exc:
        print(f"mm-schedule-tune: error: {exc}", file=sys.stderr)
        return 2
    for kernel, path in report.files.items():
        print(f"wrote {path} ({kernel})")
    if report.files:
        out = next(iter(report.files.values())).parent.parent
        print(f"use them with: export {CONFIG_DIR_ENV}={out.resolve()}")
    failed = [r for r in report.results if r.best is None and r.timings[0].error != SKIPPED]
    for kernel, shape in report.not_reached:
        print(f"not tuned (time cap): {kernel} {shape}", file=sys.stderr)
    for kernel, shape, timing in report.wrong:
        print(f"ERROR: {kernel} {shape} config {timing.config}: {timing.error}", file=sys.stderr)
    for r in failed:
        print(
            f"ERROR: {r.kernel} {r.shape}: every config failed, e.g. {r.timings[0].error}",
            file=sys.stderr,
        )
    return 1 if report.wrong or failed else 0


if __name__ == "__main__":
    sys.exit(main())
