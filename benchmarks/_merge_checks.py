"""Correctness checks of our gather/merge that the benchmark runs on the device it times.

``sweep``: random segment tables through every public entry point, outputs poisoned
first, compared bit for bit with a per-segment torch copy. ``graph_replay_check``: the
planned path captured in a CUDA graph, replayed after the sources' contents change
and after ``update`` points it at new sources. Both return a dict with a one-line
``summary`` and a list of ``failures`` (empty when everything matched).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import _common as C
import torch

from mm_schedule.kernels.dtypes import KERNEL_DTYPES

DTYPES = {d.short: getattr(torch, d.name) for d in KERNEL_DTYPES.values()}
# (source dtype, destination dtype): same-dtype copies and the casts vLLM/SGLang do.
DTYPE_PAIRS = [("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32"), ("fp32", "bf16"), ("bf16", "fp32")]


@dataclass
class RandomTable:
    hidden: int
    src_name: str
    dst_name: str
    sources: list
    merge_table: list  # rows into a [tokens, H] input_embeds
    packed_table: list  # the same rows, packed in order
    tokens: int

    @property
    def dst_dtype(self) -> torch.dtype:
        return DTYPES[self.dst_name]

    @property
    def packed_rows(self) -> int:
        return sum(n for _, _, n, _ in self.packed_table)

    def describe(self) -> str:
        return (f"H={self.hidden} {self.src_name}->{self.dst_name}, {len(self.sources)} sources, "
                f"{len(self.merge_table)} segments, first {self.merge_table[:3]}")

    def expected(self, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        merged = base.clone()
        packed = torch.empty((self.packed_rows, self.hidden), dtype=self.dst_dtype, device=base.device)
        for (s, r, n, d), (_, _, _, p) in zip(self.merge_table, self.packed_table):
            rows = self.sources[s][r : r + n].to(self.dst_dtype)
            merged[d : d + n] = rows
            packed[p : p + n] = rows
        return merged, packed

    def poisoned(self, merged: torch.Tensor) -> torch.Tensor:
        out = merged.clone()
        for _, _, n, d in self.merge_table:
            out[d : d + n] = float("nan")
        return out


def random_table(rng: random.Random, gen: torch.Generator, device: torch.device, *, hidden: int,
                 src_name: str, dst_name: str, max_sources: int, max_rows: int, aligned_only: bool = False,
                 empty: bool = False) -> RandomTable:
    """Skewed source sizes, 1-row and whole-source segments, chunk-window crops, sources
    at an odd element offset (not 16-byte aligned), gaps of text rows, shuffled order."""
    sources = []
    for _ in range(rng.randint(1, max_sources)):
        rows = rng.choice([1, 2, rng.randint(1, max_rows), rng.randint(1, max(1, max_rows // 8))])
        offset = 0 if aligned_only else rng.choice([0, 0, 1, 3])
        backing = torch.randn(rows * hidden + offset, generator=gen, device=device, dtype=torch.float32)
        sources.append(backing.to(DTYPES[src_name])[offset:].view(rows, hidden))
    picks = []
    for i, src in enumerate(sources):
        if empty or rng.random() < 0.15:
            continue
        first = rng.randint(0, src.shape[0] - 1) if rng.random() < 0.5 else 0
        n = src.shape[0] - first if rng.random() < 0.5 else rng.randint(1, src.shape[0] - first)
        picks.append((i, first, n))
    rng.shuffle(picks)
    merge_table, packed_table, token, packed = [], [], 0, 0
    for s, r, n in picks:
        token += rng.choice([0, 0, 1, 5])
        merge_table.append((s, r, n, token))
        packed_table.append((s, r, n, packed))
        token += n
        packed += n
    return RandomTable(hidden, src_name, dst_name, sources, merge_table, packed_table,
                       tokens=token + rng.choice([0, 3]))


def _kernels():
    from mm_schedule import kernels

    return kernels


def sweep(device: torch.device, trials: int, seed: int, deadline: float | None = None) -> dict:
    """Random tables through ``gather_segments`` (with ``out=`` and allocating),
    ``merge_segments`` and ``plan_segments``/``run_segments``."""
    kernels = _kernels()
    planned = "plan_segments" in kernels.__all__
    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    gpu = C.is_gpu(device)
    hiddens = [64, 100, 1000, 1152, 2048, 3584, 4096, 8192, 16384] if gpu else [64, 72, 100]
    checks, failures, done = 0, [], 0
    for trial in range(trials):
        if deadline is not None and time.monotonic() > deadline:
            break
        hidden = rng.choice(hiddens)
        src_name, dst_name = rng.choice(DTYPE_PAIRS)
        t = random_table(rng, gen, device, hidden=hidden, src_name=src_name, dst_name=dst_name,
                         max_sources=40 if gpu else 6, max_rows=max(2, 200_000 // hidden) if gpu else 40,
                         empty=trial % 11 == 10)
        base = torch.randn((t.tokens, hidden), generator=gen, device=device).to(t.dst_dtype)
        merged, packed = t.expected(base)
        poisoned = t.poisoned(merged)

        def into_packed(t=t):
            out = torch.full((t.packed_rows, t.hidden), float("nan"), dtype=t.dst_dtype, device=device)
            return kernels.gather_segments(t.sources, t.packed_table, out=out)

        def merged_api(t=t, poisoned=poisoned):
            return kernels.merge_segments(t.sources, t.merge_table, poisoned.clone())

        def merged_planned(t=t, poisoned=poisoned):
            embeds = poisoned.clone()
            kernels.run_segments(kernels.plan_segments(t.sources, t.merge_table, embeds), embeds)
            return embeds

        entry_points = [("gather out=", into_packed, packed), ("merge", merged_api, merged)]
        if t.packed_table:
            entry_points.append(("gather alloc", lambda t=t: kernels.gather_segments(
                t.sources, t.packed_table, dtype=t.dst_dtype), packed))
        if planned:
            entry_points.append(("plan/run", merged_planned, merged))
        for what, produce, expected in entry_points:
            checks += 1
            problem = _compare(produce, expected, device)
            if problem:
                failures.append(f"trial {trial} {what}: {t.describe()}: {problem}")
        done += 1
    return {"summary": f"{checks} checks over {done} random tables", "failures": failures}


def _compare(produce, expected: torch.Tensor, device: torch.device) -> str | None:
    try:
        got = produce()
        C.synchronize(device)
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"
    return None if C.bits_equal(got, expected) else "output differs from the reference"


def _refill(sources, gen: torch.Generator) -> None:
    for src in sources:
        src.copy_(torch.randn(src.shape, generator=gen, device=src.device).to(src.dtype))


def _replay_matches(graph, embeds: torch.Tensor, table: RandomTable, base: torch.Tensor, device) -> bool:
    merged, _ = table.expected(base)
    embeds.copy_(table.poisoned(merged))
    graph.replay()
    torch.cuda.synchronize(device)
    return C.bits_equal(embeds, merged)


def graph_replay_check(device: torch.device, trials: int, seed: int) -> dict | None:
    """Capture ``run_segments`` once, then replay it (1) as captured, (2) after the
    sources' contents changed in place, (3) after ``plan.update`` pointed the same plan
    at other sources and another table. Every replay writes a poisoned destination."""
    kernels = _kernels()
    if not C.is_gpu(device) or "plan_segments" not in kernels.__all__:
        return None
    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    checks, failures = 0, []
    for trial in range(trials):
        hidden = rng.choice([128, 1152, 3584, 4096])
        src_name, dst_name = rng.choice(DTYPE_PAIRS)
        first, second = (random_table(rng, gen, device, hidden=hidden, src_name=src_name, dst_name=dst_name,
                                      max_sources=12, max_rows=600, aligned_only=True) for _ in range(2))
        tokens = max(first.tokens, second.tokens, 1)
        base = torch.randn((tokens, hidden), generator=gen, device=device).to(first.dst_dtype)
        embeds = base.clone()
        capacity = max(sum(n for _, _, n, _ in t.merge_table) for t in (first, second)) + 1
        try:
            plan = kernels.plan_segments(first.sources, first.merge_table, embeds, capacity=capacity)
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                kernels.run_segments(plan, embeds)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # Captured on the stream it warmed up on: a plan runs captured only on a stream
            # it has already run on.
            with torch.cuda.graph(graph, stream=side):
                kernels.run_segments(plan, embeds)
        except Exception as exc:
            failures.append(f"trial {trial}: planning or capture raised {type(exc).__name__}: {exc}")
            continue

        for table, what in ((first, "replay"), (first, "replay after new source contents"),
                            (second, "replay after plan.update")):
            try:
                if what.endswith("contents"):
                    _refill(first.sources, gen)
                elif what.endswith("update"):
                    plan.update(second.sources, second.merge_table)
            except Exception as exc:
                failures.append(f"trial {trial} {what}: raised {type(exc).__name__}: {exc}")
                break
            checks += 1
            if not _replay_matches(graph, embeds, table, base, device):
                failures.append(f"trial {trial} {what}: {table.describe()}: replay differs from the reference")
    return {"summary": f"{checks} replays over {trials} captured plans", "failures": failures}
