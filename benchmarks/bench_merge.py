"""Segment gather and fused embedding merge, side by side with the peers' op sequences.

One process, one run, one device. For every case (shapes of real VLMs) it builds the
cache entries (one allocation per image), the segment table, the placeholder mask and
a text ``input_embeds``, then runs:

gather (multimodal rows -> a packed ``[n_rows, H]`` buffer, SGLang's contract)
  ours            ``gather_segments(sources, table, out=packed)`` (public API, plans per call)
  ours-planned    ``plan_segments`` once, ``run_segments`` timed (the no-allocation path)
  torch.cat       ``torch.cat`` of slice views, what vLLM's ``_flatten_embeddings`` and
                  SGLang's chunked-prefill path do before scattering
  copy-loop       one ``copy_`` per segment into ``packed``

merge (multimodal rows -> ``input_embeds`` at the placeholder rows)
  ours            ``merge_segments(sources, table, input_embeds)``
  ours-planned    ``plan_segments``/``run_segments`` with ``input_embeds`` as destination
  masked_scatter  vLLM from PR #22105 (Aug 2025) until PR #34246: views -> ``torch.cat`` ->
                  ``input_embeds.masked_scatter_(mask.unsqueeze(-1), flat)``; SGLang
                  0.5.17/0.5.18 run the same two ops (``mask.expand_as(dest)``)
  index_put       boolean index_put with a device mask, ``input_embeds[mask] = flat``, as
                  vLLM ran it before PR #22105 (with its ``mask.sum().item()`` count check)
                  and as older SGLang did through ``torch.where`` + index_put
  index_put-cpu   vLLM after PR #34246 (Feb 2026): the same index_put with a host mask,
                  which torch >= 2.9 turns into indices without a stream sync
  index_copy      SGLang 0.5.19+ (``_scatter_mm_embedding``, PR #37070): ``torch.cat``, then
                  cumsum over the mask gives each source row its destination row, unmasked
                  rows go to a discard slot, ``index_copy_`` writes them
  hf              HF transformers (``get_placeholder_mask`` + out-of-place
                  ``masked_scatter``, with its ``inputs_embeds[mask].numel()`` count check)
  copy-loop       one ``copy_`` per segment straight into ``input_embeds``

Every path's output is first compared bit for bit with an independent reference
(long-index gather of the concatenated sources) on poisoned buffers; a path that
differs is reported as wrong and not timed. See the "How it was measured" section the
script writes for the timing, memory and sync-counting method.

    python benchmarks/bench_merge.py                 # GPU: full run; no GPU: the CPU smoke run
    python benchmarks/bench_merge.py --cpu-smoke     # tiny torch-only configuration (CI)
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C
import _merge_peers as peers
from _merge_checks import DTYPES, graph_replay_check, sweep
from _merge_report import RunReport

from mm_schedule.kernels.tools.timing import Budget, GpuTimer, cold_cache_bytes

try:
    import triton
except ImportError:  # the torch paths and the CPU smoke run need no Triton
    triton = None

if triton is not None:

    @triton.jit
    def do_nothing(x_ptr):
        # The launch floor: a kernel with one argument and no work.
        pass


DEFAULT_OUT = Path(__file__).resolve().parent / "results"
GIB = 1 << 30
# Qwen2-VL's image pad id; the ids path must not care whether it is inside the vocabulary.
PLACEHOLDER_ID = 151655
TEXT_VOCAB = 32000


# -- cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One prefill step's multimodal rows.

    ``items`` lists, per cache entry, ``(rows in the entry, first row this step uses,
    rows this step uses)``; a chunk window that cuts an image shows up as a partial item.
    Each used span is preceded by ``text_rows`` text tokens (and the batch ends with
    ``text_rows`` more).
    """

    name: str
    model: str
    hidden: int
    dtype: str
    items: tuple[tuple[int, int, int], ...]
    src_dtype: str | None = None
    text_rows: int = 16

    @property
    def source_dtype(self) -> torch.dtype:
        return DTYPES[self.src_dtype or self.dtype]

    @property
    def dest_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def mm_rows(self) -> int:
        return sum(n for _, _, n in self.items)

    @property
    def tokens(self) -> int:
        return layout(self)[2]

    @property
    def ideal_bytes(self) -> int:
        """Bytes the ideal copy moves: every multimodal row read once and written once."""
        per_row = self.hidden * (self.source_dtype.itemsize + self.dest_dtype.itemsize)
        return self.mm_rows * per_row


def whole(*rows: int) -> tuple[tuple[int, int, int], ...]:
    return tuple((r, 0, r) for r in rows)


# Target cases first: a time cap then drops the least important ones.
GPU_CASES = (
    Case("qwen2.5vl7b-chunk8192", "Qwen2.5-VL-7B: an 8192-row prefill chunk cutting 5 images of 2048 rows",
         3584, "bf16", ((2048, 1024, 1024), *whole(2048, 2048, 2048), (2048, 0, 1024))),
    Case("llava1.5-1img", "LLaVA-1.5-7B: one image, 576 rows", 4096, "bf16", whole(576)),
    Case("qwen2.5vl72b-4img", "Qwen2.5-VL-72B: 4 images of 4096 rows", 8192, "bf16", whole(4096, 4096, 4096, 4096)),
    Case("qwen2.5vl7b-video16k", "Qwen2.5-VL-7B: one video item, 16384 rows", 3584, "bf16", whole(16384)),
    Case("llava-next-8img", "LLaVA-NeXT-7B: 8 anyres images of 2880 rows", 4096, "bf16", whole(*[2880] * 8)),
    Case("siglip-64img", "SigLIP-So400m width: 64 images of 256 rows", 1152, "bf16", whole(*[256] * 64)),
    Case("qwen2.5vl3b-skewed16", "Qwen2.5-VL-3B: 16 images, skewed 64..4096 rows", 2048, "bf16",
         whole(4096, 1024, 64, 64, 128, 64, 256, 64, 64, 128, 64, 64, 512, 64, 64, 64)),
    Case("thumbs-64x64-h8192", "72B-width: 64 thumbnails of 64 rows", 8192, "bf16", whole(*[64] * 64)),
    Case("internvl-fp16-32img", "InternVL2-2B-like: 32 tiles of 256 rows, fp16", 2048, "fp16", whole(*[256] * 32)),
    Case("llava-fp32-4img", "fp32 embeddings: 4 images of 1024 rows at H 4096", 4096, "fp32", whole(*[1024] * 4)),
    Case("cast-fp32-to-bf16", "fp32 encoder output cast into bf16 embeds (vLLM casts)", 3584, "bf16",
         whole(*[1024] * 4), src_dtype="fp32"),
)

CPU_SMOKE_CASES = (
    Case("smoke-1img", "one tiny image", 64, "bf16", whole(7), text_rows=3),
    Case("smoke-chunked", "chunk window cutting the first and last item", 96, "fp16",
         ((20, 5, 15), (9, 0, 9), (30, 0, 11)), text_rows=2),
    Case("smoke-cast", "fp32 sources into bf16 embeds", 80, "bf16", whole(3, 1, 12), src_dtype="fp32", text_rows=2),
    Case("smoke-many", "many 1-row segments and one larger", 64, "fp32", whole(*[1] * 20, 17), text_rows=1),
)


# -- a built problem --------------------------------------------------------------------


@dataclass
class Buffers:
    """One rotation set: its own cache entries, ``input_embeds`` and packed output."""

    sources: list
    embeds: torch.Tensor
    packed: torch.Tensor


@dataclass
class Problem:
    case: Case
    device: torch.device
    merge_table: list  # (source, src_row, n_rows, dst_row), dst rows in input_embeds
    gather_table: list  # the same rows, dst rows packed in order
    mask: torch.Tensor  # [tokens] bool on the device
    mask_host: torch.Tensor  # the same mask on the host (vLLM after #34246)
    input_ids: torch.Tensor  # [tokens] int64: PLACEHOLDER_ID at the multimodal rows
    expected_merged: torch.Tensor
    expected_packed: torch.Tensor
    poisoned_embeds: torch.Tensor  # text rows as in every set, multimodal rows NaN
    sets: list[Buffers] = field(default_factory=list)
    plan_info: dict = field(default_factory=dict)  # op -> what our planned path chose

    @property
    def tokens(self) -> int:
        return self.mask.numel()


def layout(case: Case):
    merge_table, gather_table = [], []
    token, packed = 0, 0
    for source, (_, first, n) in enumerate(case.items):
        token += case.text_rows
        merge_table.append((source, first, n, token))
        gather_table.append((source, first, n, packed))
        token += n
        packed += n
    return merge_table, gather_table, token + case.text_rows


def build_problem(case: Case, device: torch.device, seed: int, n_sets: int) -> Problem:
    gen = torch.Generator(device=device).manual_seed(seed)
    merge_table, gather_table, tokens = layout(case)
    H, src_dtype, dst_dtype = case.hidden, case.source_dtype, case.dest_dtype

    def random_rows(rows: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randn((rows, H), generator=gen, device=device, dtype=torch.float32).to(dtype)

    first = Buffers(
        sources=[random_rows(rows, src_dtype) for rows, _, _ in case.items],
        embeds=random_rows(tokens, dst_dtype),
        packed=torch.empty((case.mm_rows, H), dtype=dst_dtype, device=device),
    )
    mask_host = torch.zeros(tokens, dtype=torch.bool)
    for _, _, n, dst in merge_table:
        mask_host[dst : dst + n] = True

    # Independent reference: one long-index gather from all sources laid end to end.
    starts = [0]
    for rows, _, _ in case.items:
        starts.append(starts[-1] + rows)
    src_index = torch.cat([torch.arange(starts[s] + r, starts[s] + r + n) for s, r, n, _ in merge_table])
    dst_index = torch.cat([torch.arange(d, d + n) for _, _, n, d in merge_table])
    every_row = torch.cat(first.sources)
    expected_packed = every_row.index_select(0, src_index.to(device)).to(dst_dtype)
    del every_row
    expected_merged = first.embeds.clone()
    expected_merged[dst_index.to(device)] = expected_packed
    poisoned = first.embeds.clone()
    poisoned[mask_host.to(device)] = float("nan")

    input_ids = torch.randint(0, TEXT_VOCAB, (tokens,), generator=torch.Generator().manual_seed(seed))
    input_ids[mask_host] = PLACEHOLDER_ID

    problem = Problem(
        case=case, device=device, merge_table=merge_table, gather_table=gather_table,
        mask=mask_host.to(device), mask_host=mask_host, input_ids=input_ids.to(device),
        expected_merged=expected_merged,
        expected_packed=expected_packed, poisoned_embeds=poisoned, sets=[first],
    )
    for _ in range(n_sets - 1):
        problem.sets.append(
            Buffers(
                sources=[s.clone() for s in first.sources],
                embeds=first.embeds.clone(),
                packed=torch.empty_like(first.packed),
            )
        )
    return problem


def set_bytes(case: Case) -> int:
    rows = sum(r for r, _, _ in case.items)
    return case.hidden * (rows * case.source_dtype.itemsize + (case.tokens + case.mm_rows) * case.dest_dtype.itemsize)


def rotation_sets(case: Case, device: torch.device, memory_cap: int) -> int:
    """Enough copies of the inputs that consecutive calls never find theirs in the cache."""
    if not C.is_gpu(device):
        return 2
    want = math.ceil(3 * cold_cache_bytes(device) / set_bytes(case))
    return max(2, min(want, 64, memory_cap // set_bytes(case)))


# -- the paths --------------------------------------------------------------------------


@dataclass(frozen=True)
class PathSpec:
    """A way to produce the result: ``prepare(problem, buffers)`` does what may happen
    once (nothing, for the peers; the plan, for ours-planned) and returns the call."""

    name: str
    op: str  # "gather" or "merge"
    mirrors: str
    prepare: Callable[[Problem, Buffers], Callable[[], torch.Tensor]]
    ours: bool = False
    # Also timed inside a CUDA graph. Not the public API calls (they stage the table in
    # pinned host memory per call, which a replay would read after it was recycled) nor
    # the paths that read a host mask or sync.
    graphable: bool = False


def _views(p: Problem, b: Buffers) -> list:
    """The step's slices of the cache entries, as every peer takes them (views, no copy)."""
    return [b.sources[s][r : r + n] for s, r, n, _ in p.merge_table]


def _peer(merge_fn, mask_of):
    def prepare(p: Problem, b: Buffers):
        return lambda: merge_fn(b.embeds, _views(p, b), mask_of(p))

    return prepare


def _device_mask(p: Problem) -> torch.Tensor:
    return p.mask


def _host_mask(p: Problem) -> torch.Tensor:
    return p.mask_host


def _kernels():
    try:
        from mm_schedule import kernels
    except ImportError as exc:
        raise SystemExit(
            f"cannot import mm_schedule.kernels ({exc}); run `pip install -e . --no-deps` in this"
            " repository, or use benchmarks/gpu_check.sh, which sets the import path up"
        ) from exc
    return kernels


def _provides(*names: str) -> bool:
    kernels = _kernels()
    return all(name in kernels.__all__ for name in names)


def _ours_gather(p: Problem, b: Buffers):
    gather_segments = _kernels().gather_segments
    return lambda: gather_segments(b.sources, p.gather_table, out=b.packed)


def _ours_merge(p: Problem, b: Buffers):
    merge_segments = _kernels().merge_segments
    return lambda: merge_segments(b.sources, p.merge_table, b.embeds)


def _ours_planned(op: str):
    def prepare(p: Problem, b: Buffers):
        kernels = _kernels()
        table, dest = (p.gather_table, b.packed) if op == "gather" else (p.merge_table, b.embeds)
        plan = kernels.plan_segments(b.sources, table, dest)
        p.plan_info[op] = {"backend": plan.backend, "aligned": plan.aligned, "config": plan.config}
        run_segments = kernels.run_segments

        def run():
            run_segments(plan, dest)
            return dest

        return run

    return prepare


def _ours_by_ids(p: Problem, b: Buffers):
    merge_by_placeholder_ids = _kernels().merge_by_placeholder_ids

    def run():
        flat = torch.cat(_views(p, b))
        return merge_by_placeholder_ids(p.input_ids, PLACEHOLDER_ID, flat, b.embeds)

    return run


def all_paths() -> list[PathSpec]:
    planned = _provides("plan_segments", "run_segments")
    by_ids = _provides("merge_by_placeholder_ids")
    plan_text = "mm_schedule plan_segments once per buffer set, run_segments timed"
    cat = "vLLM _flatten_embeddings / SGLang torch.concat: torch.cat of the views"
    gather_paths = [
        PathSpec("ours", "gather", "mm_schedule gather_segments (API call)", _ours_gather, ours=True),
        PathSpec("ours-planned", "gather", plan_text, _ours_planned("gather"), ours=True, graphable=True),
        PathSpec("torch.cat", "gather", cat, lambda p, b: lambda: peers.concat_views(_views(p, b), b.packed.dtype),
                 graphable=True),
        PathSpec("copy-loop", "gather", "one copy_ per segment into the packed buffer",
                 lambda p, b: lambda: peers.copy_loop(b.packed, b.sources, p.gather_table), graphable=True),
    ]
    merge_paths = [
        PathSpec("ours", "merge", "mm_schedule merge_segments (API call)", _ours_merge, ours=True),
        PathSpec("ours-planned", "merge", plan_text, _ours_planned("merge"), ours=True, graphable=True),
        PathSpec("ours-by-ids", "merge", "torch.cat, then mm_schedule merge_by_placeholder_ids (for callers "
                 "that only have input_ids)", _ours_by_ids, ours=True, graphable=True),
        PathSpec("masked_scatter", "merge", "vLLM #22105 to #34246, SGLang 0.5.17/0.5.18: cat + masked_scatter_",
                 _peer(peers.masked_scatter_merge, _device_mask), graphable=True),
        PathSpec("index_put", "merge", "vLLM before #22105, older SGLang: cat + count .item() + bool index_put",
                 _peer(peers.index_put_merge, _device_mask)),
        PathSpec("index_put-cpu", "merge", "vLLM after #34246 (torch ≥ 2.9): cat + index_put with a host mask",
                 _peer(peers.index_put_host_mask_merge, _host_mask)),
        PathSpec("index_copy", "merge", "SGLang 0.5.19+ _scatter_mm_embedding: cat + cumsum + index_copy_",
                 _peer(peers.cumsum_index_copy_merge, _device_mask), graphable=True),
        PathSpec("hf", "merge", "HF transformers: count check + out-of-place masked_scatter",
                 _peer(peers.hf_merge, _device_mask)),
        PathSpec("copy-loop", "merge", "one copy_ per segment into input_embeds",
                 lambda p, b: lambda: peers.copy_loop(b.embeds, b.sources, p.merge_table), graphable=True),
    ]
    available = {"ours-planned": planned, "ours-by-ids": by_ids}
    return [s for s in gather_paths + merge_paths if available.get(s.name, True)]


# -- measuring one path -----------------------------------------------------------------


@dataclass
class Settings:
    device: torch.device
    repeats: int
    wall_calls: int
    graph_replays: int
    timer: GpuTimer | None
    budget: Budget


def poison_and_expect(p: Problem, b: Buffers, op: str) -> torch.Tensor:
    if op == "gather":
        b.packed.fill_(float("nan"))
        return p.expected_packed
    b.embeds.copy_(p.poisoned_embeds)
    return p.expected_merged


def measure(p: Problem, spec: PathSpec, s: Settings) -> dict:
    """Check one path bit for bit, then time it; a wrong path is not timed."""
    record = {"case": p.case.name, "op": spec.op, "path": spec.name, "mirrors": spec.mirrors, "ours": spec.ours}
    calls = [spec.prepare(p, b) for b in p.sets]

    def run(i: int):
        return calls[i % len(calls)]()

    # The first call compiles; checking and warming up are not charged to the time cap.
    with s.budget.untimed():
        expected = poison_and_expect(p, p.sets[0], spec.op)
        out = run(0)
        C.synchronize(s.device)
        record["bit_exact"] = C.bits_equal(out, expected)
        del out
        if not record["bit_exact"]:
            record["error"] = "output differs from the reference; not timed"
            return record
        for i in range(len(calls)):  # touches every rotation set once
            run(i)
        C.synchronize(s.device)
    preexisting = [t for b in p.sets for t in (b.embeds, b.packed)]
    record["host_syncs"] = C.count_host_syncs(lambda: run(0), s.device)
    record["transient_bytes"] = C.transient_bytes(lambda: run(0), s.device, preexisting)
    record["wall_us"] = C.wall_us_per_call(run, s.wall_calls, s.device)
    if s.timer is not None:
        times = s.timer.event_times_us(run, s.repeats, host_us=record["wall_us"])
    else:
        times = C.cpu_times_us(run, s.repeats)
    record["time_us"] = C.median(times)
    record["gbps"] = p.case.ideal_bytes / record["time_us"] / 1e3
    if s.timer is not None and spec.graphable:
        if record["host_syncs"]:
            record["graph"] = "it syncs the host"
        else:
            try:
                launches = [functools.partial(run, i) for i in range(len(calls))]
                record["graph_us"] = s.timer.graph_us(launches, s.graph_replays)
            except Exception as exc:
                record["graph"] = f"capture failed: {type(exc).__name__}: {str(exc)[:120]}"
                torch.cuda.synchronize(s.device)
    return record


def measure_case(case: Case, index: int, paths: list[PathSpec], s: Settings, args) -> tuple[list[dict], dict, int]:
    n_sets = rotation_sets(case, s.device, int(args.memory_cap_gib * 1024**3))
    problem = build_problem(case, s.device, seed=args.seed + index, n_sets=n_sets)
    records = []
    for spec in paths:
        if s.budget.exceeded():
            records.append({"case": case.name, "op": spec.op, "path": spec.name, "mirrors": spec.mirrors,
                            "ours": spec.ours, "skipped": "time cap reached"})
            continue
        try:
            records.append(measure(problem, spec, s))
        except Exception as exc:  # one broken path must not lose the rest of the run
            records.append({"case": case.name, "op": spec.op, "path": spec.name, "mirrors": spec.mirrors,
                            "ours": spec.ours, "bit_exact": False,
                            "error": f"raised {type(exc).__name__}: {str(exc)[:160]}"})
            C.synchronize(s.device)
    return records, problem.plan_info, n_sets


# -- launch floor -----------------------------------------------------------------------


def empty_launch(device: torch.device, timer: GpuTimer | None) -> dict | None:
    """Host wall and device time of launching a Triton kernel that does nothing."""
    if timer is None or triton is None:
        return None
    anchor = torch.empty(16, device=device)
    for _ in range(20):
        do_nothing[(1,)](anchor)
    wall = C.wall_us_per_call(lambda i: do_nothing[(1,)](anchor), 2000, device)
    device_us = C.median(timer.event_times_us(lambda i: do_nothing[(1,)](anchor), 50, host_us=wall))
    return {"wall_us": wall, "device_us": device_us}


def sync_counter_selftest(device: torch.device) -> str:
    if not C.is_gpu(device):
        return "n/a (CPU)"
    x = torch.ones(8, device=device)
    counted = C.count_host_syncs(lambda: x.sum().item(), device)
    silent = C.count_host_syncs(lambda: x.add_(1), device)
    verdict = "" if counted and counted >= 1 and silent == 0 else " (**the counter is unreliable on this build**)"
    return f"`.item()` counted {counted}, an in-place add counted {silent}{verdict}"


# -- main -------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny configuration on the CPU (what CI runs)")
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="where kernels_<device>.md/.json/.png go")
    ap.add_argument("--cases", help="comma-separated case names (default: every case for the device)")
    ap.add_argument("--repeats", type=int, help="timed repeats per path (default 40 on a GPU, 5 on the CPU)")
    ap.add_argument("--sweep", type=int, help="random correctness tables (default 80 on a GPU, 6 on the CPU)")
    ap.add_argument("--sweep-seconds", type=float, default=60.0, help="stop the sweep after this")
    ap.add_argument("--max-seconds", type=float, default=240.0,
                    help="stop measuring after this many seconds of timed work (checked between paths; compiles, "
                    "correctness checks and the sweep not counted)")
    ap.add_argument("--memory-cap-gib", type=float, default=24.0, help="cap on one case's rotation sets")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-plot", action="store_true")
    return ap.parse_args(argv)


def run(args, budget: Budget | None = None) -> tuple[int, RunReport]:
    """One benchmark run; ``budget`` (default: ``--max-seconds`` of timed work) is checked
    between paths. Returns the exit status and the report it wrote."""
    budget = budget or Budget(timed_s=args.max_seconds)
    gpu = torch.cuda.is_available() and not args.cpu_smoke
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    cases = GPU_CASES if gpu else CPU_SMOKE_CASES
    if args.cases:
        wanted = set(args.cases.split(","))
        unknown = wanted - {c.name for c in cases}
        if unknown:
            raise SystemExit(f"unknown case(s) {sorted(unknown)}; known here: {[c.name for c in cases]}")
        cases = tuple(c for c in cases if c.name in wanted)

    env = C.environment(device)
    interpreted = os.environ.get("TRITON_INTERPRET", "0").strip() not in ("", "0")
    env["kernel_backend"] = os.environ.get("MM_SCHEDULE_KERNEL_BACKEND", "auto") + (
        " (TRITON_INTERPRET=1)" if interpreted else "")
    env["config_dir"] = os.environ.get("MM_SCHEDULE_KERNEL_CONFIG_DIR") or "shipped tables / heuristic default"
    report = RunReport(env=env, gpu=gpu)
    if not gpu and not args.cpu_smoke:
        report.notes.append("no GPU visible: ran the CPU smoke configuration")

    settings = Settings(device=device, repeats=args.repeats or (40 if gpu else 5), wall_calls=200 if gpu else 1,
                        graph_replays=5, timer=GpuTimer(device) if gpu else None, budget=budget)
    with budget.untimed():  # compiles the empty kernel
        report.copy_gbps = 2 * GIB / settings.timer.copy_us(GIB) / 1e3 if gpu else None
        report.empty_launch = empty_launch(device, settings.timer)
        report.sync_selftest = sync_counter_selftest(device)

    # Correctness before speed: if the run is cut short, the checks are what must survive.
    trials = args.sweep if args.sweep is not None else (80 if gpu else 6)
    with budget.untimed():
        deadline = time.monotonic() + args.sweep_seconds
        if budget.hard_deadline is not None:
            deadline = min(deadline, budget.hard_deadline)
        report.sweep = sweep(device, trials, args.seed, deadline=deadline)
        report.graph_check = graph_replay_check(device, trials=4, seed=args.seed)
    print(f"[bench_merge] sweep: {report.sweep['summary']}, {len(report.sweep['failures'])} failures", flush=True)
    report.write(args.out_dir, plot=False)

    paths = all_paths()
    for index, case in enumerate(cases):
        if budget.exceeded():
            report.notes.append(f"time cap reached; skipped {', '.join(c.name for c in cases[index:])}")
            report.records += [{"case": c.name, "op": p.op, "path": p.name, "mirrors": p.mirrors, "ours": p.ours,
                                "skipped": "time cap reached"} for c in cases[index:] for p in paths]
            break
        records, plan_info, n_sets = measure_case(case, index, paths, settings, args)
        report.records += records
        report.cases.append(case)
        if settings.timer is not None:
            # The yardstick for this case: torch copying the bytes the ideal kernel moves.
            report.copy_same_bytes_us[case.name] = settings.timer.copy_us(case.ideal_bytes // 2)
        for op, info in plan_info.items():
            report.notes.append(f"{case.name} {op}: ours ran backend={info['backend']}, aligned={info['aligned']}, "
                                f"config={info['config']}")
        report.write(args.out_dir, plot=False)  # a run killed later still leaves what it measured
        print(f"[bench_merge] {case.name}: {len(records)} paths, {n_sets} rotation sets", flush=True)
        if gpu:
            torch.cuda.empty_cache()

    md = report.write(args.out_dir, plot=not args.no_plot)
    print(md.read_text())
    failures = report.failures()
    if failures:
        print(f"[bench_merge] {len(failures)} correctness failures, first: {failures[:3]}", file=sys.stderr)
        return 1, report
    return 0, report


def main(argv=None) -> int:
    return run(parse_args(argv))[0]


if __name__ == "__main__":
    sys.exit(main())
