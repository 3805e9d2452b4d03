"""Host time of one prefill step's multimodal embeddings: SGLang's own code against ours,
side by side in one process, on the same inputs, on CPU with one torch thread.

SGLang runs from its official wheels (downloaded with ``pip download --no-deps``, loaded
by ``_sglang_wheels.py`` with its heavy imports stubbed):

* ``SGLang 0.5.19``: ``mm_schedule.get_embedding_and_mask`` on its CUDA path (cross-request
  batching), and with ``mm_utils._scatter_mm_embedding`` after it for the fused comparison;
* ``SGLang 0.5.17 per-request``: ``mm_utils.get_embedding_and_mask`` on the per-request
  path that ROCm/NPU take (one encoder call and one cache walk per request).

Ours: ``mm_schedule.get_embedding_and_mask`` (the drop-in), ``embed_chunk`` (packed rows)
and ``merge_chunk`` (rows written into ``input_embeds``; compared with SGLang 0.5.19's
get_embedding_and_mask + scatter, which produce the same ``input_embeds``).

Workload: R requests x 4 single-span images x 64 placeholder tokens, hidden size 64,
float32, every request's window covering its whole prompt. Cases: every item already
cached (4 to 4,096 items), and every item a miss with a cheap encoder (it returns each
item's precomputed rows, one tensor per item). Calls alternate between the sides in a
fresh (seeded) random order every round over many repetitions, so machine noise and cache
state left by the previous call hit all sides alike; each case's rounds are split over
three sweeps through all the cases, so a slow or fast spell of the machine hits every
size alike too (the per-item flatness compares sizes). Each
side's median is reported: of the thread's CPU time (the ratios; with one torch thread a
step's host work all runs there, and time spent waiting for a core shared with other
processes is left out) and of wall-clock time. Garbage collections are counted per side
(``gc.callbacks``) while only that side runs. Every side's result is compared bit for bit with SGLang
0.5.19's (rows, mask, returned ``input_ids``, fused ``input_embeds``) before and after
timing; any difference fails the run.

Host overhead alone (``--host-overhead``): on a GPU the rows never cross the CPU, so what
the scheduler costs an engine is its host work, not the memory copy that dominates the CPU
table at large sizes. This case runs SGLang 0.5.19's code and ours unchanged with every
tensor on the ``meta`` device (no data: copies cost nothing, and any host sync would fail),
so the ratios are host overhead only; results checked by shape, dtype and device (the CPU
run checks the bits). Written to ``results/vs_sglang_host_overhead.md``.

``mm_schedule`` is imported from wherever the running interpreter finds it, so the same
script measures any checkout with its own environment:

    python benchmarks/bench_vs_sglang.py               # full run, writes results/vs_sglang.md
    python benchmarks/bench_vs_sglang.py --host-overhead   # the meta-device case, its own file
    python benchmarks/bench_vs_sglang.py --quick       # fewer sizes and repeats, prints only
    cd /path/to/other/checkout && .venv/bin/python /path/to/bench_vs_sglang.py --quick

Without ``--quick`` (or with ``--write``) the table goes to ``benchmarks/results/vs_sglang.md``
of the checkout whose ``mm_schedule`` was measured. Wheels are cached in
``~/.cache/mm-schedule/wheels`` (``MM_SCHEDULE_WHEEL_CACHE`` overrides).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mm_schedule
from mm_schedule import EmbeddingCache, MMItem, RequestChunk
from mm_schedule.placeholders import checked_mask

# A sibling file; the folder is on the path when this runs as a script, not when a test loads it.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang_wheels

IMAGES_PER_REQUEST = 4
TOKENS_PER_IMAGE = 64
HIDDEN = 64
TEXT_GAP = 8  # text tokens before, between and after the images of a request
VOCAB = 32_000
CACHE_BYTES = 4 << 30  # holds every workload: nothing is evicted
FULL_CACHED_SIZES = (4, 64, 256, 1024, 4096)
# glibc returns a freed block above its mmap threshold (at most 32 MiB) to the kernel, so
# the next step's result of that size is faulted in again page by page; these keep it.
MALLOC_REUSE_ENV = (("MALLOC_MMAP_THRESHOLD_", str(1 << 32)), ("MALLOC_TRIM_THRESHOLD_", str(1 << 32)))
MALLOC_REUSE = tuple(k for k, _ in MALLOC_REUSE_ENV)
QUICK_CACHED_SIZES = (4, 64, 1024)
MISS_SIZE = 1024

SGL19, SGL17, OURS_COMPAT, OURS_EMBED = "sglang-0.5.19", "sglang-0.5.17-per-request", "ours-compat", "ours-embed_chunk"
SGL19_SCATTER, OURS_MERGE = "sglang-0.5.19+scatter", "ours-merge_chunk"
COPY_FLOOR = "copy-floor"
LABELS = {
    SGL19: "SGLang 0.5.19 get_embedding_and_mask",
    SGL17: "SGLang 0.5.17 get_embedding_and_mask, per-request path",
    OURS_COMPAT: "ours get_embedding_and_mask",
    OURS_EMBED: "ours embed_chunk",
    SGL19_SCATTER: "SGLang 0.5.19 get_embedding_and_mask + _scatter_mm_embedding",
    OURS_MERGE: "ours merge_chunk",
    COPY_FLOOR: "one torch.cat of exactly the step's rows into a buffer made beforehand, nothing else"
                " (no planning, cache or mask): an ordinary copy of the rows every packed side makes, for"
                " reference",
}
# (ours, the SGLang side it replaces): ratio = SGLang time / our time (> 1: ours is faster).
RATIOS = ((OURS_COMPAT, SGL19), (OURS_EMBED, SGL19), (OURS_MERGE, SGL19_SCATTER), (OURS_COMPAT, SGL17))


class BenchItem(MMItem):
    """Our item type plus the two methods SGLang's path calls on its own items."""

    def acknowledge_deferred_cuda_ipc_feature(self, consumer_count: int = 1) -> None:
        """No IPC transport on CPU: nothing to release."""

    def is_video(self) -> bool:
        return str(getattr(self.modality, "name", self.modality)).upper() == "VIDEO"


class MismatchError(AssertionError):
    """A side's result differs from SGLang 0.5.19's on the same inputs."""


# -- workload -----------------------------------------------------------------------------


@dataclass
class Batch:
    """One step's inputs, in SGLang's layout and in ours (the same items)."""

    items: list
    input_ids: torch.Tensor
    placeholders: torch.Tensor
    items_size: list
    prefix: list
    extend: list
    offsets: list
    requests: list
    text_embeds: torch.Tensor
    n_rows: int

    @property
    def n_items(self) -> int:
        return len(self.items)

    def sglang_args(self, encoder: Callable) -> tuple:
        return (encoder, self.items, self.placeholders, self.input_ids, self.items_size,
                self.prefix, self.extend, self.offsets)


def build_batch(n_items: int, *, seed: int = 0, chunk: int | None = None, prefix: int = 0) -> Batch:
    """``n_items / 4`` requests of 4 images each. With ``chunk``/``prefix``, each request's
    window is ``[prefix, prefix + chunk)`` instead of its whole prompt (it may cut images)."""
    gen = torch.Generator().manual_seed(seed)
    n_requests = max(1, n_items // IMAGES_PER_REQUEST)
    prompt = TEXT_GAP * (IMAGES_PER_REQUEST + 1) + IMAGES_PER_REQUEST * TOKENS_PER_IMAGE
    extend = prompt - prefix if chunk is None else min(chunk, prompt - prefix)
    hashes = torch.randint(1, 2**62, (n_requests * IMAGES_PER_REQUEST,), generator=gen).tolist()
    items, ids, offsets, items_size, requests = [], [], [], [0], []
    for r in range(n_requests):
        row_ids = torch.randint(0, VOCAB, (prompt,), generator=gen)
        spans, mine = [], []
        for k in range(IMAGES_PER_REQUEST):
            start = TEXT_GAP + k * (TOKENS_PER_IMAGE + TEXT_GAP)
            end = start + TOKENS_PER_IMAGE - 1
            h = hashes[r * IMAGES_PER_REQUEST + k]
            pad = 1_000_000 + h % 2**30  # SGLang's pad value for hash h
            span = (start, end)
            item = BenchItem(
                hash=h, offsets=[span], pad_value=pad,
                feature=torch.randn(TOKENS_PER_IMAGE, HIDDEN, generator=gen),
            )
            row_ids[start : end + 1] = pad
            # items_offset_list holds the items' own span tuples, as SGLang's embed_mm_inputs
            # builds it (flatten_nested_list of each item's offsets).
            spans.append(span)
            mine.append(item)
        items += mine
        items_size.append(len(items))
        offsets.append(spans)
        ids.append(row_ids[prefix : prefix + extend])
        requests.append(RequestChunk(items=mine, prefix=prefix, extend=extend, offsets=spans))
    input_ids = torch.cat(ids)
    placeholders = torch.as_tensor([it.pad_value for it in items])
    n_rows = int(torch.isin(input_ids, placeholders).sum())
    return Batch(
        items=items, input_ids=input_ids, placeholders=placeholders, items_size=items_size,
        prefix=[prefix] * n_requests, extend=[extend] * n_requests, offsets=offsets, requests=requests,
        text_embeds=torch.randn(input_ids.numel(), HIDDEN, generator=gen), n_rows=n_rows,
    )


class CheapEncoder:
    """Returns each item's rows (its ``feature``), one tensor per item; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, items: list) -> list:
        self.calls += 1
        return [it.feature for it in items]


# -- the sides ----------------------------------------------------------------------------


@dataclass
class Side:
    """One implementation under test. ``reset`` gives it an empty cache; ``prepare`` runs
    before each call, untimed (it installs the side's own cache where SGLang keeps it in
    a module global); ``step`` is the timed call and returns what is compared."""

    name: str
    reset: Callable[[], None]
    prepare: Callable[[Batch], None]
    step: Callable[[Batch, CheapEncoder], dict]
    times_ns: list = field(default_factory=list)  # thread CPU time per step
    wall_ns: list = field(default_factory=list)
    gcs: int = 0
    steps: int = 0
    encoder_calls: int = 0


class DestinationBuffer:
    """The fused sides' ``input_embeds``: a copy of the batch's text embeddings, made once per
    batch. It holds the batch itself, not its ``id``, so a later batch that happens to reuse a
    freed batch's address never gets the old buffer."""

    def __init__(self) -> None:
        self._batch: Batch | None = None
        self._dest: torch.Tensor | None = None

    def prepare(self, batch: Batch) -> None:
        if self._batch is not batch:
            self._batch, self._dest = batch, batch.text_embeds.clone()

    def get(self, batch: Batch) -> torch.Tensor:
        assert self._batch is batch, "prepare() was not called for this batch"
        return self._dest


def _sglang_side(name: str, release, *, fused: bool = False) -> Side:
    module = release.scheduler
    cache_cls = release.modules["sglang.srt.mem_cache.multimodal_cache"].MultiModalStaticCache
    scatter = release.mm_utils._scatter_mm_embedding if fused else None
    state = {"cache": cache_cls(CACHE_BYTES)}
    dest_buffer = DestinationBuffer()

    def reset():
        state["cache"] = cache_cls(CACHE_BYTES)

    def prepare(batch: Batch):
        module.embedding_cache = state["cache"]
        if fused:
            dest_buffer.prepare(batch)

    def step(batch: Batch, encoder: CheapEncoder) -> dict:
        emb, mask, ids = module.get_embedding_and_mask(*batch.sglang_args(encoder))
        if not fused:
            return {"rows": emb, "mask": mask, "ids": ids}
        dest = dest_buffer.get(batch)
        scatter(dest=dest, mask=mask, src=emb)
        return {"embeds": dest}

    return Side(name, reset, prepare, step)


def _ours_sides(device: torch.device | None = None) -> list[Side]:
    state = {"embed": EmbeddingCache(CACHE_BYTES), "merge": EmbeddingCache(CACHE_BYTES)}
    dest_buffer = DestinationBuffer()
    where = {} if device is None else {"device": device}

    def compat(batch: Batch, encoder: CheapEncoder) -> dict:
        emb, mask, ids = mm_schedule.get_embedding_and_mask(*batch.sglang_args(encoder))
        return {"rows": emb, "mask": mask, "ids": ids}

    def embed(batch: Batch, encoder: CheapEncoder) -> dict:
        return {"rows": mm_schedule.embed_chunk(batch.requests, encoder, cache=state["embed"], **where).embedding}

    def merge(batch: Batch, encoder: CheapEncoder) -> dict:
        dest = dest_buffer.get(batch)
        mm_schedule.merge_chunk(dest, batch.requests, encoder, cache=state["merge"])
        return {"embeds": dest}

    def reset(key):
        return lambda: state.__setitem__(key, EmbeddingCache(CACHE_BYTES))

    mm_schedule.init_mm_embedding_cache(CACHE_BYTES)
    return [
        Side(OURS_COMPAT, lambda: mm_schedule.init_mm_embedding_cache(CACHE_BYTES), lambda b: None, compat),
        Side(OURS_EMBED, reset("embed"), lambda b: None, embed),
        Side(OURS_MERGE, reset("merge"), dest_buffer.prepare, merge),
    ]


def _copy_floor_side() -> Side:
    state: dict = {"batch": None}

    def prepare(batch: Batch):
        if state["batch"] is not batch:
            pieces = naive_pieces(batch)
            state.update(batch=batch, pieces=pieces, out=torch.empty(batch.n_rows, HIDDEN))

    def step(batch: Batch, encoder: CheapEncoder) -> dict:
        return {"rows": torch.cat(state["pieces"], out=state["out"])}

    return Side(COPY_FLOOR, lambda: None, prepare, step)


def make_sides(sgl19, sgl17) -> list[Side]:
    # SGLang 0.5.17 takes the per-request path on ROCm/NPU; its own tests select it the same way.
    sgl17.scheduler._is_hip = True
    return [
        _sglang_side(SGL19, sgl19),
        _sglang_side(SGL17, sgl17),
        _sglang_side(SGL19_SCATTER, sgl19, fused=True),
        *_ours_sides(),
        _copy_floor_side(),
    ]


META = torch.device("meta")
# The host-overhead case: the sides that run unchanged on meta tensors (SGLang 0.5.17's
# per-request path and the copy floor have nothing to add without data).
META_SIDES = (SGL19, OURS_COMPAT, OURS_EMBED, SGL19_SCATTER, OURS_MERGE)


_CAT_NAMES = ("cat", "concat", "concatenate")  # one operator under three names (SGLang calls concat)
_REAL_CAT = torch.cat
_REAL_CATS = {name: getattr(torch, name) for name in _CAT_NAMES}
_is_meta, _shape = attrgetter("is_meta"), attrgetter("shape")


def _shape_only_cat(tensors, dim=0, *, out=None):
    """``torch.cat`` for meta tensors at the cost of computing its shape. Meta's own ``cat``
    runs PyTorch's Python reference implementation (milliseconds for a thousand inputs),
    a cost of the meta device that no GPU engine pays; both sides get this one alike.
    The inputs are read by C loops (``map``), as ATen's own ``cat`` reads them."""
    tensors = tensors if type(tensors) is list else list(tensors)
    if not tensors or not all(map(_is_meta, tensors)):
        return _REAL_CAT(tensors, dim, out=out) if out is not None else _REAL_CAT(tensors, dim)
    shape = list(tensors[0].shape)
    shape[dim] = sum(map(itemgetter(dim), map(_shape, tensors)))
    if out is not None:
        return out.resize_(shape)  # one operator dispatched, as ATen's cat.out is
    return torch.empty(shape, dtype=tensors[0].dtype, device=META)


class ShapeOnlyCat:
    """While active, ``torch.cat`` (and its aliases ``concat``/``concatenate``) is
    ``_shape_only_cat`` for every caller (both sides)."""

    def __enter__(self):
        for name in _CAT_NAMES:
            setattr(torch, name, _shape_only_cat)

    def __exit__(self, *exc):
        for name, real in _REAL_CATS.items():
            setattr(torch, name, real)


class OperatorCount(TorchDispatchMode):
    """Counts the ATen operators dispatched while active: what a GPU engine launches (or at
    least dispatches) per step, whatever the host time of each."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_operators(sides: list[Side], batch: Batch, *, miss: bool) -> dict[str, int]:
    """ATen operators of one untimed step per side: from an empty cache (``miss``), else
    after a step that filled it."""
    counts = {}
    for side in sides:
        side.reset()
        if not miss:
            side.prepare(batch)
            side.step(batch, CheapEncoder())
        side.prepare(batch)
        with OperatorCount() as mode:
            side.step(batch, CheapEncoder())
        counts[side.name] = mode.count
    return counts


def mask_alone(release, runs: list[CaseRun], *, rounds: int) -> dict[tuple[str, int], dict[str, tuple]]:
    """The placeholder mask alone, per case: ours (``checked_mask``, what the drop-in runs)
    and SGLang 0.5.19's ``_get_multimodal_mask``, called alternately on the case's inputs.
    ``{(case, items): {side: (median µs of thread CPU time, ATen operators)}}``."""
    theirs = release.scheduler._get_multimodal_mask
    out = {}
    for run in runs:
        b = run.batch
        calls = {OURS_COMPAT: lambda b=b: checked_mask(b.input_ids, b.placeholders, b.n_rows),
                 SGL19: lambda b=b: theirs(b.input_ids, b.placeholders)}
        times: dict[str, list[int]] = {name: [] for name in calls}
        for r in range(rounds + 5):
            for name in (calls if r % 2 else reversed(list(calls))):
                started = time.thread_time_ns()
                calls[name]()
                if r >= 5:  # the first rounds warm up
                    times[name].append(time.thread_time_ns() - started)
        counts = {}
        for name, call in calls.items():
            with OperatorCount() as mode:
                call()
            counts[name] = mode.count
        out[(run.label, b.n_items)] = {n: (statistics.median(times[n]) / 1e3, counts[n]) for n in calls}
    return out


def make_meta_sides(sgl19) -> list[Side]:
    return [_sglang_side(SGL19, sgl19), _sglang_side(SGL19_SCATTER, sgl19, fused=True), *_ours_sides(META)]


def on_meta(batch: Batch) -> Batch:
    """``batch`` with every tensor on the meta device (new items, the same hashes and spans)."""
    items = [BenchItem(hash=it.hash, offsets=it.offsets, pad_value=it.pad_value, feature=it.feature.to(META))
             for it in batch.items]
    requests = [RequestChunk(items=items[batch.items_size[r] : batch.items_size[r + 1]], prefix=req.prefix,
                             extend=req.extend, offsets=req.offsets) for r, req in enumerate(batch.requests)]
    return Batch(
        items=items, input_ids=batch.input_ids.to(META), placeholders=batch.placeholders.to(META),
        items_size=batch.items_size, prefix=batch.prefix, extend=batch.extend, offsets=batch.offsets,
        requests=requests, text_embeds=batch.text_embeds.to(META), n_rows=batch.n_rows,
    )


def compare_meta(results: dict, batch: Batch) -> list[str]:
    """Meta tensors hold no values: every result must have the expected shape, dtype and device."""
    problems = []
    want = {"rows": (batch.n_rows, HIDDEN), "mask": (batch.input_ids.numel(), 1),
            "embeds": tuple(batch.text_embeds.shape)}
    for name, out in results.items():
        for key, shape in want.items():
            t = out.get(key)
            if key in out and (t is None or not t.is_meta or tuple(t.shape) != shape):
                problems.append(f"{name}: {key} is {None if t is None else (tuple(t.shape), t.device)},"
                                f" expected {shape} on meta")
        if "ids" in out and out["ids"] is not batch.input_ids:
            problems.append(f"{name}: returned input_ids is not the tensor passed in")
    return problems


# -- checking -----------------------------------------------------------------------------


def naive_rows(batch: Batch) -> torch.Tensor:
    return torch.cat(naive_pieces(batch))


def naive_pieces(batch: Batch) -> list[torch.Tensor]:
    """The rows the step must produce, written from the semantics alone: per request, per
    item in order, the item's rows whose placeholder positions fall in the window."""
    pieces = []
    for r in range(len(batch.prefix)):
        lo, hi = batch.prefix[r], batch.prefix[r] + batch.extend[r]
        for item in batch.items[batch.items_size[r] : batch.items_size[r + 1]]:
            (start, end), = item.offsets
            first, last = max(start, lo), min(end, hi - 1)
            if first <= last:
                pieces.append(item.feature[first - start : last - start + 1])
    return pieces


def _same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def compare(results: dict, batch: Batch) -> list[str]:
    """Every difference between the sides' results and the independent expectation."""
    problems = []
    rows = naive_rows(batch)
    mask = torch.isin(batch.input_ids, batch.placeholders).unsqueeze(-1)
    embeds = batch.text_embeds.clone()
    embeds[mask.squeeze(-1)] = rows
    for name, out in results.items():
        if "rows" in out and not _same_bits(out["rows"], rows):
            problems.append(f"{name}: rows differ from the expected {tuple(rows.shape)}")
        if "mask" in out and not _same_bits(out["mask"], mask):
            problems.append(f"{name}: placeholder mask differs")
        if "ids" in out and out["ids"] is not batch.input_ids:
            problems.append(f"{name}: returned input_ids is not the tensor passed in")
        if "embeds" in out and not _same_bits(out["embeds"], embeds):
            problems.append(f"{name}: fused input_embeds differ")
    return problems


def check_once(sides: list[Side], batch: Batch) -> list[str]:
    """Two untimed rounds: a miss step from empty caches, then an all-hit step."""
    check = compare_meta if batch.input_ids.is_meta else compare
    problems = []
    for side in sides:
        side.reset()
    for label in ("all-miss", "all-cached"):
        results = {}
        for side in sides:
            side.prepare(batch)
            results[side.name] = side.step(batch, CheapEncoder())
        problems += [f"{batch.n_items} items, {label}: {p}" for p in check(results, batch)]
    return problems


# -- measuring ----------------------------------------------------------------------------


class GcCounter:
    """Collections the garbage collector starts while a given side runs."""

    def __init__(self) -> None:
        self.active: Side | None = None
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start" and self.active is not None:
            self.active.gcs += 1

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)


def run_round(sides: list[Side], batch: Batch, shift: int, *, miss: bool, gcs: GcCounter, keep: bool) -> dict:
    results = {}
    # A fresh order every round (seeded by the round, so runs repeat): under a fixed
    # rotation each side always follows the same neighbour and inherits its cache state.
    order = random.Random(shift).sample(sides, len(sides))
    for side in order:
        if miss:
            side.reset()
        side.prepare(batch)
        encoder = CheapEncoder()
        gcs.active = side
        start_wall, start = time.perf_counter_ns(), time.thread_time_ns()
        out = side.step(batch, encoder)
        elapsed, wall = time.thread_time_ns() - start, time.perf_counter_ns() - start_wall
        gcs.active = None
        side.times_ns.append(elapsed)
        side.wall_ns.append(wall)
        side.steps += 1
        side.encoder_calls += encoder.calls
        results[side.name] = out if keep else None
        out = None
    return results


@dataclass
class CaseResult:
    case: str
    n_items: int
    rounds: int
    median_us: dict  # thread CPU time
    wall_us: dict
    gcs_per_step: dict
    encoder_calls_per_step: dict
    pass_median_us: dict = field(default_factory=dict)  # side -> its median in each pass
    operators: dict = field(default_factory=dict)  # side -> ATen operators per step


@dataclass
class CaseRun:
    """One case's timed rounds, gathered over every pass of the sweep."""

    batch: Batch
    miss: bool
    rounds_per_pass: int = 0
    times_ns: dict = field(default_factory=dict)
    wall_ns: dict = field(default_factory=dict)
    gcs: dict = field(default_factory=dict)
    steps: dict = field(default_factory=dict)
    encoder_calls: dict = field(default_factory=dict)
    pass_medians: dict = field(default_factory=dict)
    operators: dict = field(default_factory=dict)
    last: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return "all-miss" if self.miss else "all-cached"

    def take(self, sides: list[Side]) -> None:
        for s in sides:
            self.times_ns.setdefault(s.name, []).extend(s.times_ns)
            self.wall_ns.setdefault(s.name, []).extend(s.wall_ns)
            self.gcs[s.name] = self.gcs.get(s.name, 0) + s.gcs
            self.steps[s.name] = self.steps.get(s.name, 0) + s.steps
            self.encoder_calls[s.name] = self.encoder_calls.get(s.name, 0) + s.encoder_calls
            if s.times_ns:
                self.pass_medians.setdefault(s.name, []).append(statistics.median(s.times_ns) / 1e3)

    def result(self) -> CaseResult:
        names = list(self.times_ns)
        return CaseResult(
            case=self.label, n_items=self.batch.n_items, rounds=len(self.times_ns[names[0]]),
            median_us={n: statistics.median(self.times_ns[n]) / 1e3 for n in names},
            wall_us={n: statistics.median(self.wall_ns[n]) / 1e3 for n in names},
            gcs_per_step={n: self.gcs[n] / self.steps[n] for n in names},
            encoder_calls_per_step={n: self.encoder_calls[n] / self.steps[n] for n in names},
            pass_median_us=dict(self.pass_medians), operators=dict(self.operators),
        )


def _clear(sides: list[Side]) -> None:
    for side in sides:
        side.times_ns, side.wall_ns, side.gcs, side.steps, side.encoder_calls = [], [], 0, 0, 0


def measure(sides: list[Side], runs: list[CaseRun], *, passes: int, budget_s: float, min_rounds: int,
            max_rounds: int, on_case: Callable[[CaseRun], None] | None = None) -> list[str]:
    """Time every case, its rounds split over ``passes`` sweeps through all the cases: a
    machine that gets slower or faster for a while then shifts every size alike instead
    of the sizes that happened to run then (the per-item flatness compares sizes)."""
    problems = []
    for run in runs:
        problems += check_once(sides, run.batch)
    gcs = GcCounter()
    try:
        for p in range(passes):
            for run in runs:
                started = time.perf_counter()
                # Warm-up, discarded: primes the caches an all-miss case emptied.
                run_round(sides, run.batch, 0, miss=run.miss, gcs=gcs, keep=False)
                if not run.rounds_per_pass:
                    per_round = time.perf_counter() - started
                    total = int(min(max(budget_s / max(per_round, 1e-6), min_rounds), max_rounds))
                    run.rounds_per_pass = max(1, -(-total // passes))
                _clear(sides)
                for r in range(run.rounds_per_pass):
                    last = p == passes - 1 and r == run.rounds_per_pass - 1
                    out = run_round(sides, run.batch, p * max_rounds + r, miss=run.miss, gcs=gcs, keep=last)
                    if last:
                        run.last = out
                run.take(sides)
                if p == passes - 1 and on_case is not None:
                    on_case(run)
    finally:
        gcs.close()
    for run in runs:
        check = compare_meta if run.batch.input_ids.is_meta else compare
        problems += [f"{run.batch.n_items} items, {run.label}, timed: {x}" for x in check(run.last, run.batch)]
    return problems


# -- reporting ----------------------------------------------------------------------------


def _fmt_us(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def _table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def ratio(result: CaseResult, ours: str, theirs: str, *, wall: bool = False) -> float:
    times = result.wall_us if wall else result.median_us
    return times[theirs] / times[ours]


def pass_ratios(result: CaseResult, ours: str, theirs: str) -> list[float]:
    """The ratio of each pass's medians: every pass interleaves the sides round by round,
    so a noisy spell of the machine hits both sides of a ratio alike."""
    return sorted(t / o for o, t in zip(result.pass_median_us[ours], result.pass_median_us[theirs]))


def ratio_spread(result: CaseResult, ours: str, theirs: str) -> str:
    """``median (min-max)`` of the per-pass ratios."""
    each = pass_ratios(result, ours, theirs)
    return f"{statistics.median(each):.2f}x ({each[0]:.2f}-{each[-1]:.2f})"


def report(results: list[CaseResult], env: list[str], problems: list[str]) -> str:
    order = [SGL19, OURS_COMPAT, OURS_EMBED, SGL19_SCATTER, OURS_MERGE, SGL17, COPY_FLOOR]
    out = ["# SGLang's own code vs mm_schedule, side by side", "", *env, ""]
    out += [
        "Workload: R requests x 4 single-span images x 64 placeholder tokens, hidden 64, float32,",
        "windows covering whole prompts; CPU, one torch thread. Each side's median over rounds in",
        "which the sides run in a fresh seeded random order. The main measure is the thread's CPU time",
        "(`time.thread_time_ns`): with one torch thread all of a step's host work runs on it, and",
        "unlike wall time it does not count the time the process waits while other processes",
        "hold the cores, which on a shared machine penalises long calls more than short ones.",
        "Wall-clock medians follow for reference.",
        "",
        "Sides: " + "; ".join(f"`{k}` = {v}" for k, v in LABELS.items()) + ".",
        "",
        "## Host CPU time per step (median; µs per item in parentheses)",
        "",
    ]
    rows = []
    for r in results:
        rows.append([r.case, r.n_items, r.rounds] + [
            f"{_fmt_us(r.median_us[s])} ({r.median_us[s] / r.n_items:.2f})" for s in order
        ])
    out += [_table(["case", "items", "rounds", *order], rows), ""]
    out += ["## Ratios (SGLang time / our time; above 1 means ours is faster)", ""]
    rows = [[r.case, r.n_items] + [f"{ratio(r, o, t):.2f}x" for o, t in RATIOS] for r in results]
    out += [_table(["case", "items", *(f"{o} vs {t}" for o, t in RATIOS)], rows), ""]
    out += ["## Wall-clock time per step (median) and its ratios", ""]
    rows = [[r.case, r.n_items] + [_fmt_us(r.wall_us[s]) for s in order] +
            [f"{ratio(r, o, t, wall=True):.2f}x" for o, t in RATIOS] for r in results]
    out += [_table(["case", "items", *order, *(f"{o} vs {t}" for o, t in RATIOS)], rows), ""]
    out += ["## Garbage collections per step (started while the side ran)", ""]
    rows = [[r.case, r.n_items] + [f"{r.gcs_per_step[s]:.2f}" for s in order] for r in results]
    out += [_table(["case", "items", *order], rows), ""]
    out += ["## Encoder calls per step", ""]
    rows = [[r.case, r.n_items] + [f"{r.encoder_calls_per_step[s]:g}" for s in order] for r in results]
    out += [_table(["case", "items", *order], rows), ""]
    out += ["## Per-item cost, all cached (µs per item)", ""]
    cached = [r for r in results if r.case == "all-cached"]
    rows = [[s] + [f"{r.median_us[s] / r.n_items:.2f}" for r in cached] +
            [_spread(cached, s)] for s in order]
    out += [_table(["side", *(str(r.n_items) for r in cached), "max/min from 64 items up"], rows), ""]
    out += [f"An ordinary copy of the rows ({COPY_FLOOR}) costs more per item once a step's rows no",
            "longer fit the CPU's caches (16 MiB at 1,024 items). Our packed sides write results of",
            "4 MiB or more with streaming stores instead, so at those sizes they copy for less.", ""]
    out += targets(results)
    out += ["## Checks", ""]
    if problems:
        out += [f"- FAIL {p}" for p in problems]
    else:
        out += ["- PASS: every side's rows, mask, returned input_ids and fused input_embeds were",
                "  bit-identical to an independent expectation (and so to each other) on the miss",
                "  step, the first cached step and the last timed step of every case."]
    return "\n".join(out) + "\n"


# (ours, SGLang side it is held against) for the targets below.
TARGET_PAIRS = ((OURS_COMPAT, SGL19), (OURS_EMBED, SGL19), (OURS_MERGE, SGL19_SCATTER))
FLAT_SPREAD = 1.5  # max/min of the per-item cost: every size within ±20% of a common value


def targets(results: list[CaseResult]) -> list[str]:
    """The product's speed targets, each met or not on this run (n/a: case not run)."""
    cached = {r.n_items: r for r in results if r.case == "all-cached"}
    miss = next((r for r in results if r.case == "all-miss"), None)

    def mark(ok: bool | None, text: str) -> str:
        return "n/a" if ok is None else f"{'met' if ok else 'NOT met'} ({text})"

    rows = []
    for ours, theirs in TARGET_PAIRS:
        row = [f"{ours} vs {theirs}"]
        for n in (1024, 4096):
            r = cached.get(n)
            row.append(mark(r and ratio(r, ours, theirs) >= 3, f"{ratio(r, ours, theirs):.2f}x") if r else "n/a")
        flat = [r.median_us[ours] / n for n, r in sorted(cached.items()) if 64 <= n <= 4096]
        spread = max(flat) / min(flat) if len(flat) > 1 else None
        sizes = [n for n in sorted(cached) if 64 <= n <= 4096]
        whole_range = "" if sizes[:1] == [64] and sizes[-1:] == [4096] else f", sizes {sizes} only"
        row.append(mark(spread <= FLAT_SPREAD, f"max/min {spread:.2f}{whole_range}") if spread else "n/a")
        r4 = cached.get(4)
        row.append(mark(ratio(r4, ours, theirs) >= 1, f"{ratio(r4, ours, theirs):.2f}x") if r4 else "n/a")
        row.append(mark(ratio(miss, ours, theirs) >= 1, f"{ratio(miss, ours, theirs):.2f}x") if miss else "n/a")
        worse = [f"{r.case} {r.n_items}" for r in results if r.gcs_per_step[ours] > r.gcs_per_step[theirs]]
        row.append("met" if not worse else f"NOT met ({', '.join(worse)})")
        rows.append(row)
    headers = ["pair", ">= 3x at 1,024", ">= 3x at 4,096", f"per-item flat, 64 to 4,096 (max/min <= {FLAT_SPREAD})",
               "4 items >= 1x", "all-miss >= 1x", "GC per step <= SGLang's"]
    return ["## Targets (all cached unless noted; CPU time ratios)", "", _table(headers, rows), ""]


META_RATIOS = ((OURS_COMPAT, SGL19), (OURS_EMBED, SGL19), (OURS_MERGE, SGL19_SCATTER))
# Host overhead alone: (case, items) -> the ratio each pair must reach (median of the passes).
META_TARGETS = {("all-cached", 1024): 7.0, ("all-cached", 4096): 9.0, ("all-miss", 64): 2.0, ("all-miss", 1024): 2.0}
META_MISS_SIZES = (64, 1024)
META_PASSES = 5


OPERATORS_FROM = 64  # fewer items: fewer placeholder ids, which the mask compares one by one (torch.isin)


def constant_operators(results: list[CaseResult], side: str) -> bool | None:
    """Whether ``side`` dispatched as many ATen operators at every all-cached size from
    ``OPERATORS_FROM`` items up (None: fewer than two such sizes counted)."""
    counted = [r.operators[side] for r in results
               if r.case == "all-cached" and r.n_items >= OPERATORS_FROM and side in r.operators]
    return None if len(counted) < 2 else len(set(counted)) == 1


def report_meta(results: list[CaseResult], env: list[str], problems: list[str],
                masks: dict | None = None) -> str:
    order = list(META_SIDES)
    passes = min((len(v) for r in results for v in r.pass_median_us.values()), default=0)
    out = ["# Host overhead alone: SGLang's own code vs mm_schedule on meta tensors", "", *env, ""]
    out += [
        "Same workload and method as `vs_sglang.md` (R requests x 4 single-span images x 64 placeholder",
        "tokens, hidden 64, float32 shapes), but every tensor lives on the `meta` device: inputs, encoder",
        "outputs, cache entries, `input_ids`, `input_embeds`. Both sides run unchanged there; no data",
        "exists, so no row is copied and any host sync would fail. What remains is each side's host",
        "work: planning, cache lookups, validation, mask and tensor bookkeeping, what a GPU engine's",
        "CPU pays per step while the GPU does the copies. Medians of the thread's CPU time.",
        "On meta, `torch.cat` runs PyTorch's Python reference implementation (about 8 ms for 1,024",
        "inputs), which no GPU engine pays; while this case runs, `torch.cat` and its aliases",
        "`torch.concat` / `torch.concatenate` (SGLang's last step calls `concat`) are replaced for every",
        "caller, SGLang and ours alike, by a version that only computes the result's shape.",
        "All-miss: a fresh cache every step and a cheap encoder (each item's precomputed rows, one",
        "tensor per item), so every item is planned, encoded, validated and cached.",
        "",
        f"The sides run in a fresh random order every round; a case's rounds are split over {passes} passes",
        "through all the cases, and each ratio below is the median of the passes' ratios with their",
        "range (min-max), so a noisy spell of the shared machine shows as spread instead of moving one",
        "side alone.",
        "",
        "Sides: " + "; ".join(f"`{k}` = {LABELS[k]}" for k in order) + ".",
        "",
        "## Host CPU time per step (median; µs per item in parentheses)",
        "",
    ]
    rows = [[r.case, r.n_items, r.rounds] + [f"{_fmt_us(r.median_us[s])} ({r.median_us[s] / r.n_items:.2f})"
                                             for s in order] for r in results]
    out += [_table(["case", "items", "rounds", *order], rows), ""]
    out += [f"## Ratios (SGLang time / our time; above 1 means ours is faster): median of {passes} passes"
            " (min-max)", ""]
    rows = [[r.case, r.n_items] + [ratio_spread(r, o, t) for o, t in META_RATIOS] for r in results]
    out += [_table(["case", "items", *(f"{o} vs {t}" for o, t in META_RATIOS)], rows), ""]
    out += ["## ATen operators per step", "",
            "Counted with a `TorchDispatchMode` over one untimed step per side (all-cached: after a step",
            "that filled the cache); the shape-only `cat` counts as the one operator it stands for. On a",
            "GPU the drop-in also checks asynchronously that the mask marks one token per row (`sum`, `eq`,",
            "`_assert_async`: 3 more, at every size); on meta there is nothing to compare, so it is skipped.", ""]
    rows = [[r.case, r.n_items] + [r.operators.get(s, "n/a") for s in order] for r in results]
    out += [_table(["case", "items", *order], rows), ""]
    flat = [(s, constant_operators(results, s)) for s in order if s.startswith("ours")]
    out += [f"All cached, operators per step the same at every size from {OPERATORS_FROM} items up: " + "; ".join(
        f"{s} {'yes' if ok else 'NO' if ok is not None else 'n/a'}" for s, ok in flat) + ".",
            ""]
    if masks:
        out += mask_section(results, masks)
    out += ["## Wall-clock time per step (median)", ""]
    rows = [[r.case, r.n_items] + [_fmt_us(r.wall_us[s]) for s in order] for r in results]
    out += [_table(["case", "items", *order], rows), ""]
    by_case = {(r.case, r.n_items): r for r in results}
    rows = []
    for ours, theirs in META_RATIOS:
        row = [f"{ours} vs {theirs}"]
        for key, bar in META_TARGETS.items():
            r = by_case.get(key)
            if r is None:
                row.append("n/a")
                continue
            each = pass_ratios(r, ours, theirs)
            got = statistics.median(each)
            row.append(f"{'met' if got >= bar else 'NOT met'} ({got:.2f}x; {each[0]:.2f}-{each[-1]:.2f})")
        rows.append(row)
    headers = ["pair", *(f">= {bar:g}x, {case} {n:,}" for (case, n), bar in META_TARGETS.items())]
    out += ["## Targets (median of the passes' ratios; their range)", "", _table(headers, rows), ""]
    out += ["## Checks", ""]
    out += [f"- FAIL {p}" for p in problems] if problems else [
        "- PASS: every side returned meta tensors of the expected shapes (rows, mask, input_embeds) and",
        "  the input_ids passed in, on the miss step, the first cached step and the last timed step."]
    return "\n".join(out) + "\n"


def mask_section(results: list[CaseResult], masks: dict) -> list[str]:
    """The mask alone, and each drop-in step less its mask (a difference of medians)."""
    out = ["## The placeholder mask alone", "",
           "Both drop-ins return a mask of the placeholder tokens in `input_ids`. SGLang's is one",
           "`torch.isin`, which on a GPU waits for the device once the ids outnumber its direct-comparison",
           "rule (its sorting path calls `unique`); ours is one operator that never waits,",
           "`torch.ops.mm_schedule.placeholder_mask`: on a GPU one Triton launch comparing every token with",
           "every id, on meta its shape function (one dispatch, as ATen's operators have).",
           "Timed alone on each case's inputs (medians of thread CPU time, the two alternating); the last",
           "column is the drop-in step's ratio with each side's mask time taken out of its step time.", ""]
    rows = []
    for r in results:
        m = masks.get((r.case, r.n_items))
        if m is None:
            continue
        (ours_us, ours_ops), (theirs_us, theirs_ops) = m[OURS_COMPAT], m[SGL19]
        rest = (r.median_us[SGL19] - theirs_us) / max(r.median_us[OURS_COMPAT] - ours_us, 1e-9)
        rows.append([r.case, r.n_items, f"{_fmt_us(ours_us)} ({ours_ops} ops)", f"{_fmt_us(theirs_us)} ({theirs_ops} ops)",
                     f"{rest:.2f}x"])
    headers = ["case", "items", f"{OURS_COMPAT} mask", f"{SGL19} mask", "step less mask, ours-compat vs sglang-0.5.19"]
    return [*out, _table(headers, rows), ""]


def _spread(cached: list[CaseResult], side: str) -> str:
    per_item = [r.median_us[side] / r.n_items for r in cached if r.n_items >= 64]
    return f"{max(per_item) / min(per_item):.2f}" if len(per_item) > 1 else "n/a"


def _git(root: Path, *args: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return proc.stdout.strip() or "?"


def checkout_root() -> Path:
    """The checkout whose ``mm_schedule`` this process imported."""
    return Path(mm_schedule.__file__).resolve().parent.parent


def environment(releases, stubbed: list[str]) -> list[str]:
    root = checkout_root()
    # Only the measured code counts: "?" means clean (or not a git checkout).
    status = _git(root, "status", "--porcelain", "--untracked-files=no", "--", "mm_schedule", "kernels")
    dirty = "" if status == "?" else " (with uncommitted changes to mm_schedule/ or kernels/)"
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return [
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- command: `{' '.join(['python', *sys.argv])}`",
        f"- mm_schedule: commit {_git(root, 'rev-parse', '--short', 'HEAD')}{dirty}",
        f"- SGLang: {', '.join(r.wheel.name for r in releases)} (official wheels, `pip download --no-deps`)",
        f"- stubbed SGLang modules (import-only, see benchmarks/_sglang_wheels.py): {len(stubbed)}",
        f"- python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} torch thread(s),"
        f" gc thresholds {gc.get_threshold()}",
        "- glibc malloc: " + (", ".join(f"{k}={os.environ[k]}" for k in MALLOC_REUSE if k in os.environ) or "defaults"),
        f"- CPU: {cpu} ({len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores visible)",
        f"- load average when written (1, 5, 15 min): {_load_average()}",
    ]


def _load_average() -> str:
    """How busy the machine was (other processes share its cores): a ratio's spread grows with it."""
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except (AttributeError, OSError):
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="mm_schedule is imported from the running interpreter's path: run this file with another "
               "checkout's interpreter from that checkout (cd /path/to/checkout && .venv/bin/python "
               "/path/to/benchmarks/bench_vs_sglang.py --quick) to measure that checkout; the results "
               "file then goes to that checkout's benchmarks/results/.",
    )
    parser.add_argument("--quick", action="store_true", help="sizes 4, 64, 1024 and few rounds; prints, writes no file")
    parser.add_argument("--write", action="store_true", help="write the results file even with --quick")
    parser.add_argument("--sizes", type=int, nargs="+", metavar="N", help="all-cached step sizes (items)")
    parser.add_argument("--miss-sizes", type=int, nargs="+", metavar="N",
                        help=f"all-miss step sizes (items; default {MISS_SIZE}, with --host-overhead"
                             f" {' and '.join(map(str, META_MISS_SIZES))})")
    parser.add_argument("--budget", type=float, metavar="S", help="seconds of rounds per case")
    parser.add_argument("--passes", type=int, metavar="P",
                        help="sweeps through all the cases that share each case's rounds (default 3; with"
                             f" --host-overhead {META_PASSES}, each pass giving one ratio of the reported spread)")
    parser.add_argument("--output", type=Path, help="results file (default: <checkout>/benchmarks/results/vs_sglang.md,"
                        " or vs_sglang_reuse-freed-memory.md)")
    parser.add_argument("--reuse-freed-memory", action="store_true",
                        help="rerun under glibc malloc settings that keep freed memory for reuse, so that a step's"
                             " large new result (over 32 MiB at 4,096 items) is not faulted in page by page on every"
                             " step; every side pays those faults otherwise, and a GPU caching allocator does not")
    parser.add_argument("--host-overhead", action="store_true",
                        help="every tensor on the meta device: host overhead alone, no data movement on either side;"
                             " writes results/vs_sglang_host_overhead.md")
    args = parser.parse_args(argv)
    if args.host_overhead:
        return main_host_overhead(args)
    if args.reuse_freed_memory and MALLOC_REUSE[0] not in os.environ:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **dict(MALLOC_REUSE_ENV)})

    torch.set_num_threads(1)
    sizes = args.sizes or (QUICK_CACHED_SIZES if args.quick else FULL_CACHED_SIZES)
    budget = args.budget or (0.6 if args.quick else 4.0)
    min_rounds, max_rounds = (5, 61) if args.quick else (11, 401)
    print(f"mm_schedule from {checkout_root()}", flush=True)
    try:
        releases = [_sglang_wheels.load_release(v) for v in ("0.5.19", "0.5.17")]
    except _sglang_wheels.WheelUnavailable as exc:
        print(f"cannot load SGLang: {exc}", file=sys.stderr)
        return 2
    sides = make_sides(*releases)
    stubbed = sorted(set(releases[0].stubbed) | set(releases[1].stubbed))
    cases = [(n, False) for n in sizes] + [(n, True) for n in args.miss_sizes or (MISS_SIZE,)]
    runs = [CaseRun(build_batch(n, seed=n), miss) for n, miss in cases]

    def progress(run: CaseRun) -> None:
        result = run.result()
        print(f"{result.case:>10} {result.n_items:>5} items, {result.rounds:>3} rounds: " + ", ".join(
            f"{o} {ratio(result, o, t):.2f}x vs {t}" for o, t in RATIOS), flush=True)

    problems = measure(sides, runs, passes=args.passes or 3, budget_s=budget, min_rounds=min_rounds,
                       max_rounds=max_rounds, on_case=progress)
    results = [run.result() for run in runs]
    text = report(results, environment(releases, stubbed), problems)
    print()
    print(text)
    if not args.quick or args.write or args.output:
        name = "vs_sglang_reuse-freed-memory.md" if args.reuse_freed_memory else "vs_sglang.md"
        path = args.output or checkout_root() / "benchmarks" / "results" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    print("check: " + ("FAIL" if problems else "PASS"))
    return 1 if problems else 0


def main_host_overhead(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    sizes = args.sizes or (QUICK_CACHED_SIZES if args.quick else FULL_CACHED_SIZES)
    budget = args.budget or (0.6 if args.quick else 3.0)
    min_rounds, max_rounds = (5, 61) if args.quick else (11, 401)
    print(f"mm_schedule from {checkout_root()}", flush=True)
    try:
        release = _sglang_wheels.load_release("0.5.19")
    except _sglang_wheels.WheelUnavailable as exc:
        print(f"cannot load SGLang: {exc}", file=sys.stderr)
        return 2
    sides = make_meta_sides(release)
    cases = [(n, False) for n in sizes] + [(n, True) for n in args.miss_sizes or META_MISS_SIZES]
    runs = [CaseRun(on_meta(build_batch(n, seed=n)), miss) for n, miss in cases]

    def progress(run: CaseRun) -> None:
        result = run.result()
        print(f"{result.case:>10} {result.n_items:>5} items, {result.rounds:>3} rounds: " + ", ".join(
            f"{o} {ratio_spread(result, o, t)} vs {t}" for o, t in META_RATIOS), flush=True)

    with ShapeOnlyCat():
        problems = measure(sides, runs, passes=args.passes or META_PASSES, budget_s=budget, min_rounds=min_rounds,
                           max_rounds=max_rounds, on_case=progress)
        for run in runs:
            run.operators = count_operators(sides, run.batch, miss=run.miss)
    masks = mask_alone(release, runs, rounds=31 if args.quick else 201)
    text = report_meta([run.result() for run in runs], environment([release], sorted(release.stubbed)), problems,
                       masks)
    print()
    print(text)
    if not args.quick or args.write or args.output:
        path = args.output or checkout_root() / "benchmarks" / "results" / "vs_sglang_host_overhead.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    print("check: " + ("FAIL" if problems else "PASS"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
