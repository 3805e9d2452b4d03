"""The unattended check for a machine with an NVIDIA or AMD GPU, in one Python process.

    python -m mm_schedule.kernels.tools.gpu_check --out DIR        # on the GPU machine
    bash benchmarks/gpu_check.sh --out DIR                          # same, from a bare checkout
    TRITON_INTERPRET=1 python -m mm_schedule.kernels.tools.gpu_check --dry-run --out DIR   # CPU

Steps, in order, each inside what is left of ``--budget-s``:

1. environment: Python, torch, Triton, device, architecture;
2. AOT report: every kernel variant and config compiled for every target (``tools.aot``),
   one subprocess per target started now, on the CPU, beside the GPU steps; collected last;
3. GPU tests: ``pytest -m gpu`` over ``tests/kernels`` in one subprocess (its own
   process so that the tests' settings cannot leak into the timings);
4. tuner: the benchmark's bf16 shapes over the quick search space; the config files are
   rewritten after every shape, compiles happen before any timing and are not charged to
   the tuner's share of the budget;
5. bandwidth sweep (``tools.bandwidth``) with the tuned configs;
6. benchmark: ``benchmarks/bench_merge.py`` with the tuned configs: correctness sweep,
   CUDA-graph replay check, every case against the peers, the targets' verdicts. It
   writes its files after every case and stops between paths when its time is up.

Everything lands in ONE archive, ``DIR/gpu_check.tar.gz``, rewritten after every step (a
run killed half-way keeps what it had), holding the folder ``gpu_check/``:
``summary.json`` (rewritten after every step: how far the run got), ``gpu_check.log``
(all output), ``tests.log``, ``aot_report.json`` and ``aot_<target>.log``,
``bandwidth.{json,md}``, ``tuned/<kernel>/<device>.json`` and
``kernels_<device>.{md,json,png}``. The loose folder is removed once archived
(``--keep-files`` keeps it). Nothing is written anywhere else: ``--results-dir`` and
``--configs-dir`` also copy the results and install the tuned configs where asked.

``--dry-run`` runs every step on the CPU under the Triton interpreter at tiny sizes (the
AOT report: two compiles for sm_90), in a minute or two: what the test-suite does to keep
this script working without a GPU.

Exit status: 0 every step passed; 1 a step failed or timed out; 2 no GPU (and no
``--dry-run``), or a bad argument.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
ARCHIVE = "gpu_check.tar.gz"
FOLDER = "gpu_check"  # the archive's one top-level folder
AOT_TARGETS = ("sm90", "sm80", "gfx942", "gfx950", "gfx90a")
# The benchmark's bf16 hidden sizes and row counts around its cases.
TUNE_SHAPES = "bfloat16:{h}:1024,bfloat16:{h}:16384"
TUNE_HIDDEN = (3584, 4096, 8192, 1152, 2048)
DRY_RUN_CONFIGS = "BLOCK_M=4;BLOCK_H=64;num_warps=1;num_stages=1"
DRY_RUN_AOT = ("sm90",), 2  # targets, compiles each


@dataclass
class Step:
    name: str
    status: str = "not run"  # ok | failed | timed out | skipped | not run
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Summary:
    started_utc: str
    command: str
    dry_run: bool
    environment: dict = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    tuner: list[dict] = field(default_factory=list)
    targets: list = field(default_factory=list)
    exit_status: int | None = None

    def write(self, out: Path) -> None:
        path = out / "summary.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)


class _Tee:
    """Writes to the terminal and to the log file, so the log holds everything printed."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text):
        self.stream.write(text)
        self.log.write(text)
        self.log.flush()  # a run killed from outside keeps its log
        return len(text)

    def flush(self):
        self.stream.flush()
        self.log.flush()

    def isatty(self):
        return False


class Clock:
    """The whole run's deadline; each step gets at most its cap of what is left."""

    def __init__(self, budget_s: float, reserve_s: float):
        self.started = time.monotonic()
        self.deadline = self.started + budget_s - reserve_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def cap(self, seconds: float) -> float:
        return max(0.0, min(seconds, self.left()))


STEPS = ("aot", "tests", "tune", "bandwidth", "bench")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m mm_schedule.kernels.tools.gpu_check",
        description="GPU tests, tuner and kernel benchmark in one process; results in --out.",
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for every result file")
    ap.add_argument(
        "--budget-s", type=float, default=450.0, help="whole run (default: %(default)s s)"
    )
    ap.add_argument(
        "--tests-s", type=float, default=60.0, help="cap on the GPU tests (default: %(default)s)"
    )
    ap.add_argument(
        "--tune-s",
        type=float,
        default=45.0,
        help="cap on the tuner's timing, compiles not counted (default: %(default)s)",
    )
    ap.add_argument(
        "--tests",
        default="tests/kernels",
        help="pytest paths, relative to the repository (default: %(default)s)",
    )
    ap.add_argument(
        "--aot-s", type=float, default=240.0, help="cap on the AOT report (default: %(default)s)"
    )
    ap.add_argument(
        "--bandwidth-s", type=float, default=45.0, help="cap on the bandwidth sweep (default: %(default)s)"
    )
    ap.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="also copy the results here, e.g. benchmarks/results of a checkout (default: nowhere)",
    )
    ap.add_argument(
        "--configs-dir",
        type=Path,
        default=None,
        help="also install the tuned config files here, e.g. kernels/configs, where the runtime"
        " loads them (default: nowhere)",
    )
    ap.add_argument("--keep-files", action="store_true", help="keep the archived folder beside the archive")
    ap.add_argument("--skip", default="", help=f"comma-separated steps to skip: {','.join(STEPS)}")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU under TRITON_INTERPRET=1, tiny sizes: checks the script, measures nothing",
    )
    args = ap.parse_args(argv)
    unknown = {s for s in args.skip.split(",") if s} - set(STEPS)
    if unknown:
        ap.error(f"--skip: unknown steps {sorted(unknown)}")
    if min(args.budget_s, args.tests_s, args.tune_s, args.aot_s, args.bandwidth_s) <= 0:
        ap.error("--budget-s and every step's cap must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    root = args.out.resolve()
    out = root / FOLDER
    if out.exists():
        shutil.rmtree(out)  # a previous run's files would be archived as this run's
    out.mkdir(parents=True)
    summary = Summary(
        started_utc=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        command=" ".join(["python -m mm_schedule.kernels.tools.gpu_check", *(argv or sys.argv[1:])]),
        dry_run=args.dry_run,
    )
    # A `timeout` or a job runner stops the run with SIGTERM: end it like Ctrl-C, so the
    # summary still says how far it got.
    signal.signal(signal.SIGTERM, _interrupt)
    with open(out / "gpu_check.log", "a", encoding="utf-8") as log:
        with contextlib.redirect_stdout(_Tee(sys.stdout, log)):
            with contextlib.redirect_stderr(_Tee(sys.stderr, log)):
                try:
                    status = _run(args, out, summary)
                except KeyboardInterrupt:
                    status = 1
                    running = [s for s in summary.steps if s.status == "not run"]
                    for step in running:
                        step.status, step.detail = "timed out", "stopped from outside (signal)"
                finally:
                    for process in _children:  # compiles still running when the run was stopped
                        if process.poll() is None:
                            process.kill()
                            process.wait()
                summary.exit_status = status
                summary.write(out)
                _print_summary(summary)
                _publish(args, out, summary.environment, final=True)
                print(f"everything is in {root / ARCHIVE}")
    write_archive(out)
    if not args.keep_files:
        shutil.rmtree(out)
    return status


def write_archive(out: Path) -> Path:
    """``out``'s files as ``<out's parent>/gpu_check.tar.gz`` (written beside, then moved in:
    a run killed while archiving keeps the previous archive)."""
    archive = out.parent / ARCHIVE
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(out.rglob("*")):
            if path.is_file() and not path.name.endswith(".tmp"):
                tar.add(path, arcname=str(Path(FOLDER) / path.relative_to(out)), recursive=False)
    os.replace(tmp, archive)
    return archive


def _publish(args, out: Path, env: dict, *, final: bool = False) -> None:
    """Where asked (``--results-dir``, ``--configs-dir``), copy what the run has so far
    and install the tuned configs; called after every step, so a run killed later keeps
    what it measured."""
    # A run that found no GPU measured nothing: there is nothing to put anywhere.
    if not env or not (args.dry_run or env.get("gpu")):
        return
    if args.results_dir is not None:
        _copy_results(out, args.results_dir, env, quiet=not final)
    if args.configs_dir is not None:
        _install_configs(out, args.configs_dir, quiet=not final)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _run(args, out: Path, summary: Summary) -> int:
    clock = Clock(args.budget_s, reserve_s=5.0)
    interpreted = os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0")
    if args.dry_run and not interpreted:
        print("--dry-run needs TRITON_INTERPRET=1 in the environment (set before Python starts)")
        return 2
    os.environ.pop("MM_SCHEDULE_KERNEL_CONFIG_DIR", None)  # the shipped configs, then ours
    if args.dry_run:
        # CPU tensors take the torch reference unless Triton (interpreted) is asked for.
        os.environ["MM_SCHEDULE_KERNEL_BACKEND"] = "triton"
    else:
        os.environ["TRITON_INTERPRET"] = "0"  # compiled for the GPU
        os.environ.pop("MM_SCHEDULE_KERNEL_BACKEND", None)
    os.environ["PYTHONUNBUFFERED"] = "1"
    from ..backend import refresh_backend

    refresh_backend()

    env = _environment(args.dry_run)
    summary.environment = env
    for key, value in env.items():
        print(f"{key:>12}: {value}")
    summary.write(out)
    if not args.dry_run and not env.get("gpu"):
        print("ERROR: torch sees no GPU here. Nothing was measured; --dry-run exercises the"
              " script on the CPU.")  # fmt: skip
        return 2
    skip = set(filter(None, args.skip.split(",")))
    # Compiling needs only the CPU: it runs beside the GPU steps and is collected last.
    aot = None if "aot" in skip else _start_aot(args, out, clock)
    steps = [
        ("tests", lambda step: _gpu_tests(args, out, clock, step)),
        ("tune", lambda step: _tune(args, out, clock, step, env, summary)),
        ("bandwidth", lambda step: _bandwidth(args, out, clock, step)),
        ("bench", lambda step: _bench(args, out, clock, step, summary)),
        ("aot", lambda step: _collect_aot(args, aot, out, clock, step)),
    ]
    for name, body in steps:
        step = Step(name)
        summary.steps.append(step)
        if name in skip:
            step.status, step.detail = "skipped", "--skip"
        elif clock.left() < 5 and name != "aot":  # the AOT report has been running all along
            step.status, step.detail = "timed out", f"not started: {clock.left():.0f} s of the budget left"
        else:
            print(f"\n== {name} ({clock.left():.0f} s of the budget left)", flush=True)
            started = time.monotonic()
            try:
                body(step)
            except Exception as exc:
                step.status = "failed"
                step.detail = f"raised {type(exc).__name__}: {exc}"
                traceback.print_exc()
            step.seconds = round(time.monotonic() - started, 1)
        print(f"== {name}: {step.status} ({step.seconds} s) {step.detail}", flush=True)
        summary.write(out)
        _publish(args, out, env)
        write_archive(out)
    bad = [s for s in summary.steps if s.status in ("failed", "timed out")]
    return 1 if bad else 0


def _environment(dry_run: bool) -> dict:
    import torch

    env = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "repository": str(REPO),
        "gpu": None,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "not importable: the kernels would fall back to torch"
    if dry_run:
        env["mode"] = "dry run: Triton interpreter on CPU, tiny sizes, nothing measured"
        return env
    if torch.cuda.is_available():
        from ..device_names import device_candidates

        device = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = torch.cuda.get_device_name(device)
        env["arch"] = getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}"
        env["multiprocessors"] = props.multi_processor_count
        env["memory_gib"] = round(props.total_memory / 2**30, 1)
        env["config_names"] = list(device_candidates(device))
    return env


def _gpu_tests(args, out: Path, clock: Clock, step: Step) -> None:
    cap = clock.cap(args.tests_s)
    paths = [str(REPO / p) for p in args.tests.split(",") if p]
    command = [
        sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
        "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"), *paths,
    ]  # fmt: skip
    print(" ".join(command), flush=True)
    # Run outside the checkout: from its root, ``mm_schedule/`` would be imported without
    # the ``kernels/`` that lives beside it.
    try:
        done = subprocess.run(
            command,
            cwd=out,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=cap,
        )
    except subprocess.TimeoutExpired as exc:
        print(_text(exc.output))
        (out / "tests.log").write_text(_text(exc.output), encoding="utf-8")
        step.status, step.detail = "timed out", f"pytest killed after {cap:.0f} s"
        return
    print(done.stdout)
    (out / "tests.log").write_text(done.stdout, encoding="utf-8")
    last = done.stdout.strip().splitlines()[-1:] or [""]
    # pytest: 0 passed, 5 nothing collected (no GPU tests selected), anything else failed.
    if done.returncode == 0:
        step.status, step.detail = "ok", last[0]
    elif done.returncode == 5:
        step.status, step.detail = "ok", "no test is marked gpu"
    else:
        step.status, step.detail = "failed", f"pytest exit {done.returncode}: {last[0]}"


def _text(output) -> str:
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output or ""


def _tune(args, out: Path, clock: Clock, step: Step, env: dict, summary: Summary) -> None:
    from .space import Shape, parse_config_space, parse_shapes
    from .timing import Budget
    from .tune import tune

    if args.dry_run:
        shapes = [Shape("bfloat16", 64, 16)]
        configs = parse_config_space(DRY_RUN_CONFIGS)
        options = {"reps": 1, "item_rows": 8}
    else:
        shapes = parse_shapes(",".join(TUNE_SHAPES.format(h=h) for h in TUNE_HIDDEN))
        configs = None
        options = {"reps": 10}
    budget = Budget(timed_s=args.tune_s, hard_deadline=time.monotonic() + clock.cap(2 * args.tune_s))

    def progress(message: str) -> None:
        print(message, flush=True)
        summary.tuner.append({"at_s": round(time.monotonic() - budget.started, 1), "msg": message})
        summary.write(out)

    report = tune(
        ["segment_gather"],
        shapes,
        configs=configs,
        quick=configs is None,
        out=out / "tuned",
        command="python -m mm_schedule.kernels.tools.gpu_check (tuner step)",
        budget=budget,
        log=progress,
        **options,
    )
    timed = sum(r.best is not None for r in report.results)
    step.detail = (
        f"{timed} of {len(shapes)} shapes tuned ({report.method}), compiles {report.compile_s:.0f} s"
        f" outside the cap; files: {', '.join(str(p.relative_to(out)) for p in report.files.values())}"
    )
    if report.wrong:
        kernel, shape, timing = report.wrong[0]
        step.status = "failed"
        step.detail += f"; WRONG RESULT {kernel} {shape} {timing.config}: {timing.error}"
    elif report.not_reached:
        step.status = "timed out"
        step.detail += f"; {len(report.not_reached)} shapes not reached (files keep the rest)"
    elif timed < len(report.results):
        step.status = "failed"
        step.detail += "; every config failed for some shape (see the log)"
    else:
        step.status = "ok"
    if report.files:
        os.environ["MM_SCHEDULE_KERNEL_CONFIG_DIR"] = str(out / "tuned")
        from .. import tuned_configs

        tuned_configs.clear_cache()  # the launchers' resolved launches too


def _bandwidth(args, out: Path, clock: Clock, step: Step) -> None:
    import torch

    from . import bandwidth
    from .timing import Budget

    device = torch.device("cpu") if args.dry_run else torch.device("cuda", torch.cuda.current_device())
    budget = Budget(hard_deadline=time.monotonic() + clock.cap(args.bandwidth_s))
    doc = bandwidth.sweep(out, device=device, dry_run=args.dry_run, budget=budget)
    bad = bandwidth.failures(doc)
    step.detail = f"{len(doc['records'])} cases, files bandwidth.json and bandwidth.md"
    if bad:
        step.status = "failed"
        step.detail += f"; WRONG or failed: {', '.join(r['name'] for r in bad)}"
    elif doc["not_reached"]:
        step.status = "timed out"
        step.detail += f"; {len(doc['not_reached'])} cases not reached"
    else:
        step.status = "ok"


def aot_main(argv: list[str]) -> int:
    """``OUT TARGET MAX``: compile reports for one target into ``OUT`` (JSON, rewritten after
    every compile, so a process stopped at its time cap keeps what it compiled); ``MAX``
    compiles at most (0: all). Run as a subprocess by the check, with the real Triton JIT."""
    from . import aot

    path, target, limit = Path(argv[0]), argv[1], int(argv[2])
    reports = []
    for report in aot.compile_reports(aot.all_cases(), [target]):
        reports.append(report)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(reports, indent=1, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        if len(reports) == limit:
            break
    return 0


def _start_aot(args, out: Path, clock: Clock) -> list:
    """One compiling subprocess per target, started now; ``(target, process, log)`` each."""
    targets, limit = DRY_RUN_AOT if args.dry_run else (AOT_TARGETS, 0)
    env = dict(os.environ, TRITON_INTERPRET="0")  # compiled code is what the report is about
    running = []
    for target in targets:
        log = open(out / f"aot_{target}.log", "w", encoding="utf-8")  # closed when collected
        command = [sys.executable, "-c", "import sys; from mm_schedule.kernels.tools.gpu_check import aot_main;"
                   " sys.exit(aot_main(sys.argv[1:]))", str(out / f"aot_{target}.json"), target, str(limit)]  # fmt: skip
        # At a lower priority: the benchmark beside it times host work too.
        process = subprocess.Popen(command, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   preexec_fn=(lambda: os.nice(10)) if hasattr(os, "nice") else None)  # fmt: skip
        running.append((target, process, log))
        _children.append(process)
    return running


_children: list = []


def _collect_aot(args, running, out: Path, clock: Clock, step: Step) -> None:
    """Wait for the compiles up to the AOT cap (counted from the run's start) or the end of
    the budget, stop the rest, and merge what each target compiled into ``aot_report.json``."""
    stop_at = min(clock.started + args.aot_s, clock.deadline)
    reports, unfinished = [], []
    for target, process, log in running:
        try:
            process.wait(timeout=max(0.0, stop_at - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            unfinished.append(target)
        log.close()
        part = out / f"aot_{target}.json"
        if part.is_file():
            reports += json.loads(part.read_text(encoding="utf-8"))
            part.unlink()
        if process.returncode not in (0, None) and target not in unfinished:
            unfinished.append(f"{target} (exit {process.returncode}, see aot_{target}.log)")
    narrow = [r for r in reports if not (r.get("vector_load") and r.get("vector_store")) and r.get("aligned")]
    spills = [r for r in reports if r.get("spill_bytes")]
    doc = {"targets": [t for t, _, _ in running], "compiles": len(reports), "unfinished": unfinished,
           "aligned_without_16_byte_access": len(narrow), "spilling": len(spills), "reports": reports}  # fmt: skip
    (out / "aot_report.json").write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    step.detail = (f"{len(reports)} compiles for {', '.join(doc['targets'])}; {len(narrow)} aligned variants"
                   f" without 16-byte loads and stores, {len(spills)} spilling")  # fmt: skip
    if narrow or spills or any("exit" in u for u in unfinished):
        step.status = "failed"
    elif unfinished:
        step.status, step.detail = "timed out", step.detail + f"; stopped at the cap: {', '.join(unfinished)}"
    else:
        step.status = "ok"


def _bench(args, out: Path, clock: Clock, step: Step, summary: Summary) -> None:
    from .timing import Budget

    bench = _load_bench()
    argv = ["--out-dir", str(out), "--sweep-seconds", "20"]
    if args.dry_run:
        argv += ["--cpu-smoke", "--cases", "smoke-1img,smoke-cast", "--repeats", "1", "--sweep",
                 "2", "--no-plot"]  # fmt: skip
    # The benchmark checks the deadline between paths; it takes all that is left.
    status, report = bench.run(bench.parse_args(argv), Budget(hard_deadline=clock.deadline))
    summary.targets = report.targets() if report else []
    skipped = report.skipped() if report else []
    failures = report.failures() if report else ["the benchmark produced no report"]
    measured = [r for r in report.records if "skipped" not in r] if report else []
    step.detail = f"{len(measured)} (case, path) pairs measured"
    if failures:
        step.status, step.detail = "failed", step.detail + f"; {len(failures)} correctness failures"
    elif skipped:
        step.status = "timed out"
        step.detail += f"; time cap: {len(skipped)} (case, path) pairs not measured"
    else:
        step.status = "ok" if status == 0 else "failed"


def _load_bench():
    """``benchmarks/bench_merge.py`` as a module (the folder is scripts, not a package)."""
    import importlib.util

    if "bench_merge" in sys.modules:
        return sys.modules["bench_merge"]
    spec = importlib.util.spec_from_file_location("bench_merge", BENCHMARKS / "bench_merge.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_merge"] = module  # dataclasses look their module up while built
    spec.loader.exec_module(module)
    return module


def _install_configs(out: Path, configs: Path, *, quiet: bool) -> None:
    """The tuned files into a config folder the runtime reads (``<kernel>/<device>.json``)."""
    installed = []
    for path in sorted((out / "tuned").glob("*/*.json")):
        target = configs / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        installed.append(str(target))
    if installed and not quiet:
        print(f"tuned configs installed where the runtime loads them: {', '.join(installed)}")


def _copy_results(out: Path, results: Path, env: dict, *, quiet: bool = False) -> None:
    """The benchmark's and the sweep's files, the log and the tuned configs into ``results``
    (e.g. a checkout's ``benchmarks/results``)."""
    results.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in sorted([*out.glob("kernels_*"), *out.glob("bandwidth.*")]):
        shutil.copy2(path, results / path.name)
        copied.append(path.name)
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", str(env.get("gpu") or "cpu")).strip("_")
    shutil.copy2(out / "gpu_check.log", results / f"gpu_check_{label}.log")
    copied.append(f"gpu_check_{label}.log")
    for path in sorted((out / "tuned").glob("*/*.json")):
        target = results / "tuned" / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied.append(str(target.relative_to(results)))
    if not quiet:
        print(f"copied to {results}: {', '.join(copied)}")


def _print_summary(summary: Summary) -> None:
    print("\n== gpu_check summary")
    for step in summary.steps:
        print(f"  {step.name:<6} {step.status:<10} {step.seconds:>6.1f} s  {step.detail}")
    for target, measured, verdict in summary.targets:
        print(f"  target: {target}: {measured} -> {verdict}")
    print(f"  exit status {summary.exit_status}")


if __name__ == "__main__":
    sys.exit(main())
