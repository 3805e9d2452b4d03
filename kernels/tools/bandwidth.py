"""The segment copy's bandwidth over the table shapes that matter, against ``copy_``.

Each case is a table (rows per segment, destination rows, hidden size, dtype): one
image, a few large images in a long destination, many images, thousands of small
segments. For each, ``plan_segments`` with a fixed grid (the plan's ``capacity``) is
checked bit for bit into a poisoned destination, then ``run_segments`` is timed with
``timing.GpuTimer`` (cold caches, the host hidden behind a spin) next to
``dst.copy_(src)`` of the same bytes. A row counts once read and once written. The
programs the launch starts and the tiles with work are reported as well: a launch
shaped by the destination's rows rather than the table's shows there.

``sweep(out, ...)`` rewrites ``bandwidth.json`` and ``bandwidth.md`` in ``out`` after
every case, so a run stopped half-way keeps what it measured. Under
``TRITON_INTERPRET=1`` (``tiny=True``) every case shrinks to a few rows of 64 elements
and is timed by the wall clock: that checks the sweep, it measures nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .timing import Budget


@dataclass(frozen=True)
class SweepCase:
    name: str
    segment_rows: tuple[int, ...]  # rows of each segment, one source each
    dest_rows: int  # the destination's rows; segments are spread evenly over it
    hidden: int = 3584
    dtype: str = "bfloat16"


def _many(n: int, rows: int) -> tuple[int, ...]:
    return (rows,) * n


# Most telling first: a run out of time keeps these.
CASES = (
    SweepCase("1 image x 1024 rows", (1024,), 1024),
    SweepCase("1 image x 4096 rows", (4096,), 4096),
    SweepCase("1 image x 16384 rows", (16384,), 16384),
    SweepCase("2 images x 256 rows in 32768", (256, 256), 32768),
    SweepCase("2 images x 1024 rows in 8192", (1024, 1024), 8192),
    SweepCase("64 images x 256 rows", _many(64, 256), 64 * 256 + 64),
    SweepCase("4096 segments x 16 rows", _many(4096, 16), 4096 * 16),
    SweepCase("1 image x 1024 rows, H=1152", (1024,), 1024, hidden=1152),
    SweepCase("1 image x 4096 rows, H=7168", (4096,), 4096, hidden=7168),
    SweepCase("1 image x 4096 rows, float32", (4096,), 4096, dtype="float32"),
    SweepCase("1 image x 256 rows", (256,), 256),
)


def tiny(case: SweepCase) -> SweepCase:
    """The case at interpreter size: at most 8 segments of at most 6 rows, H = 64."""
    rows = tuple(min(r, 2 + i % 5) for i, r in enumerate(case.segment_rows[:8]))
    return SweepCase(case.name, rows, sum(rows) + len(rows), hidden=64, dtype=case.dtype)


def _problem(case: SweepCase, device, seed: int):
    import torch

    dtype = getattr(torch, case.dtype)
    gen = torch.Generator(device=device).manual_seed(seed)  # drawn where they live: no host copies
    sources = [(torch.randn(n, case.hidden, generator=gen, device=device) * 3).to(dtype) for n in case.segment_rows]
    gap = (case.dest_rows - sum(case.segment_rows)) // len(case.segment_rows)
    segments, row = [], 0
    for i, n in enumerate(case.segment_rows):
        segments.append((i, 0, n, row))
        row += n + gap
    dest = torch.empty(case.dest_rows, case.hidden, dtype=dtype, device=device)
    return sources, segments, dest


def _same_bits(a, b) -> bool:
    import torch

    as_int = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.view(as_int), b.view(as_int))


def measure(case: SweepCase, device, timer, repeats: int, seed: int = 0) -> dict:
    """One case: checked, then timed (``timer`` None: wall clock, nothing measured)."""
    import torch

    from ..segment_copy.launch import gather_segments_ref, plan_segments, run_segments
    from ..segment_copy.table import count_tiles

    sources, segments, dest = _problem(case, device, seed)
    record = asdict(case)
    record["segment_rows"] = f"{len(case.segment_rows)} x {case.segment_rows[0]}" if len(
        set(case.segment_rows)) == 1 else list(case.segment_rows)  # fmt: skip
    probe = plan_segments(sources, segments, dest)
    capacity = count_tiles(segments, probe.config["BLOCK_M"])
    plan = plan_segments(sources, segments, dest, capacity=capacity)
    record.update(config=plan.config, vector_width=plan.vec, programs=plan.grid, tiles_with_work=capacity)
    dest.fill_(float("nan"))
    expected = dest.clone()
    gather_segments_ref(sources, segments, expected)
    run_segments(plan, dest)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    record["bit_exact"] = _same_bits(dest, expected)
    if not record["bit_exact"]:
        record["error"] = "output differs from gather_segments_ref; not timed"
        return record
    moved = 2 * sum(case.segment_rows) * case.hidden * dest.element_size()
    record["bytes_moved"] = moved
    if timer is None:
        start = time.perf_counter()
        for _ in range(repeats):
            run_segments(plan, dest)
        record["wall_us"] = (time.perf_counter() - start) / repeats * 1e6
        return record
    us = statistics.median(timer.event_times_us(lambda i: run_segments(plan, dest), repeats, host_us=30.0))
    copy_us = timer.copy_us(moved // 2, repeats)
    record.update(
        time_us=round(us, 2),
        gbps=round(moved / us / 1e3, 1),
        copy_gbps=round(moved / copy_us / 1e3, 1),
        pct_of_copy=round(100 * copy_us / us, 1),
    )
    return record


def sweep(out: Path, *, device, dry_run: bool, budget: Budget | None = None, log=print) -> dict:
    """Every case in ``CASES`` that the budget reaches; returns the document it wrote."""
    from .timing import GpuTimer

    out = Path(out)
    budget = budget or Budget()
    timer = None if dry_run else GpuTimer(device)
    doc = {"device": str(device), "dry_run": dry_run, "records": [], "not_reached": []}
    if timer is not None:
        import torch

        doc["gpu"] = torch.cuda.get_device_name(device)
        doc["flush_mib"] = timer.flush_mib
    for index, case in enumerate(CASES):
        if budget.exceeded():
            doc["not_reached"].append(case.name)
            continue
        case = tiny(case) if dry_run else case
        try:
            record = measure(case, device, timer, repeats=2 if dry_run else 20, seed=index)
        except Exception as exc:  # one failing case must not lose the others
            record = {"name": case.name, "bit_exact": False, "error": f"raised {type(exc).__name__}: {exc}"}
        doc["records"].append(record)
        log(f"[bandwidth] {_line(record)}")
        _write(out, doc)
    _write(out, doc)
    return doc


def failures(doc: dict) -> list[dict]:
    return [r for r in doc["records"] if not r.get("bit_exact")]


def _line(r: dict) -> str:
    if r.get("error"):
        return f"{r['name']}: {r['error']}"
    if "gbps" in r:
        return (f"{r['name']}: {r['time_us']} us, {r['gbps']} GB/s = {r['pct_of_copy']}% of copy_"
                f" ({r['programs']} programs, {r['tiles_with_work']} tiles)")  # fmt: skip
    return f"{r['name']}: bit-exact, {r['wall_us']:.0f} us wall (interpreter, not a measurement)"


def _write(out: Path, doc: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("bandwidth.json", json.dumps(doc, indent=1) + "\n"), ("bandwidth.md", _markdown(doc))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)


def _markdown(doc: dict) -> str:
    lines = [
        f"# Segment copy bandwidth on {doc.get('gpu', doc['device'])}",
        "",
        "run_segments of a plan with a fixed grid, cold caches; bytes = rows read + rows written;"
        " % of copy_ = dst.copy_(src) of the same bytes over the kernel's time.",
        "",
        "| case | H | dtype | programs | tiles with work | us | GB/s | % of copy_ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["records"]:
        if r.get("error"):
            lines.append(f"| {r['name']} | | | | | {r['error']} | | |")
            continue
        us = r.get("time_us", f"{r.get('wall_us', 0):.0f} (wall, interpreter)")
        lines.append(f"| {r['name']} | {r['hidden']} | {r['dtype']} | {r['programs']} | {r['tiles_with_work']} |"
                     f" {us} | {r.get('gbps', '')} | {r.get('pct_of_copy', '')} |")  # fmt: skip
    if doc["not_reached"]:
        lines += ["", f"Not reached in the time cap: {', '.join(doc['not_reached'])}."]
    return "\n".join(lines) + "\n"
