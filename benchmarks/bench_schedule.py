"""Host overhead of scheduling one prefill step, in microseconds per item.

The step: 256 requests x 4 images, 729 placeholder rows per image (SigLIP so400m at
384 px), every request's window covering its whole prompt, all item hashes distinct.
Cases, each timed as the median of repeated single steps:

* ``plan_step``, all misses: planning against an empty cache;
* ``plan_step``, all hits: planning against a cache holding every item;
* ``embed_chunk``, all misses: plan + one encoder call + row validation + cache
  insertion + assembly, with an encoder that does no work (each item's ``feature`` is
  already its embedding and is returned as is, one tensor per item), so what is left
  is the scheduler's own cost;
* ``embed_chunk``, all hits: plan + assembly from the cache.

The hidden size is 8 so that moving rows costs little next to the host work; the
bytes each step copies are in the table. There is no peer column: SGLang's own code runs
side by side with ours in ``bench_vs_sglang.py``, and its per-request encoding against
ours in ``bench_encoder_batching.py``.

Every timed case is also checked: the plan's shape (one encoder batch with every
miss, or no batch and every source a hit), the step report, and the assembled rows
bit-for-bit against a naive concatenation of the items' rows.

    python benchmarks/bench_schedule.py            # full run, writes results/schedule.md
    python benchmarks/bench_schedule.py --quick    # 16 requests, a few repeats, no file
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mm_schedule import EmbeddingCache, MMItem, RequestChunk, StepContext, embed_chunk, plan_step
from mm_schedule.plan import HIT

RESULTS = Path(__file__).resolve().parent / "results" / "schedule.md"
TEXT_GAP = 12  # text tokens before, between and after images
NO_ACK = StepContext(on_cache_hit=None)  # plain MMItems carry no IPC handle to release


# -- results file (shared with bench_encoder_batching.py) ---------------------------------


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def environment_lines() -> list[str]:
    command = " ".join(["python", *sys.argv])
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return [
        f"- date: {date}",
        f"- command: `{command}`",
        f"- python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads",
        f"- CPU: {cpu_name()} ({_core_count()} cores visible)",
    ]


def _core_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section between this benchmark's markers, keeping the
    other benchmarks' sections of the same file untouched."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Scheduler benchmarks\n\nWritten by the scripts named in each section.\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- the step ------------------------------------------------------------------------------


def image_requests(n_requests: int, images: int, rows: int, *, text_gap: int, feature: Callable[[], object],
                   item_hash: Callable[[int, int], int]) -> list[RequestChunk]:
    """``n_requests`` whole-prompt chunks, each of ``images`` single-span images of ``rows``
    placeholder tokens with ``text_gap`` text tokens before, between and after them.
    ``feature()`` makes the next image's encoder input (called in request, then image
    order); ``item_hash(r, i)`` is image ``i`` of request ``r``'s hash."""
    requests = []
    for r in range(n_requests):
        items = []
        for i in range(images):
            start = text_gap + i * (rows + text_gap)
            items.append(MMItem(hash=item_hash(r, i), offsets=[(start, start + rows - 1)], feature=feature()))
        requests.append(RequestChunk(items=items, prefix=0, extend=text_gap + images * (rows + text_gap)))
    return requests


def build_requests(n_requests: int, images: int, rows: int, hidden: int) -> list[RequestChunk]:
    gen = torch.Generator().manual_seed(0)
    return image_requests(n_requests, images, rows, text_gap=TEXT_GAP,
                          feature=lambda: torch.randn(rows, hidden, generator=gen),
                          item_hash=lambda r, i: (r * images + i + 1) * 1_000_003)


def identity_encoder(items):
    """No compute: each item's feature already is its embedding."""
    return [item.feature for item in items]


def naive_rows(requests: list[RequestChunk]) -> torch.Tensor:
    return torch.cat([item.feature for req in requests for item in req.items])


def warmed_cache(requests: list[RequestChunk]) -> EmbeddingCache:
    cache = EmbeddingCache(1 << 40)
    for req in requests:
        for item in req.items:
            cache.insert(item.hash, item.feature)
    return cache


def median_us(step: Callable[[], object], prepare: Callable[[], None], repeats: int) -> tuple[float, float]:
    """Median wall time and median process CPU time of ``step``, in µs; ``prepare`` runs
    untimed before each. CPU time is what the step itself burned: on a shared machine it
    is far steadier than wall time, which also counts time spent descheduled."""
    prepare()
    step()  # warm-up: first-call imports and allocations
    wall, cpu = [], []
    for _ in range(repeats):
        prepare()
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        cpu.append((time.process_time() - c0) * 1e6)
        wall.append((time.perf_counter() - w0) * 1e6)
    return statistics.median(wall), statistics.median(cpu)


def load_average() -> str:
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


# -- cases ----------------------------------------------------------------------------------


def run_cases(requests: list[RequestChunk], repeats: int) -> tuple[list[list[object]], list[str]]:
    n_items = sum(len(r.items) for r in requests)
    expected = naive_rows(requests)
    copied_mb = expected.numel() * expected.element_size() / 1e6
    failures: list[str] = []
    state: dict[str, object] = {}

    def fresh_cache() -> None:
        state["cache"] = EmbeddingCache(1 << 40)

    def warm() -> None:
        state["cache"] = state.setdefault("warm", warmed_cache(requests))

    def plan() -> None:
        state["out"] = plan_step(requests, state["cache"])

    def embed() -> None:
        state["out"] = embed_chunk(requests, identity_encoder, cache=state["cache"], context=NO_ACK)

    def check_plan(all_hits: bool) -> None:
        p = state["out"]
        if all_hits:
            ok = not p.encoder_batches and all(s.status == HIT for s in p.sources) and len(p.sources) == n_items
        else:
            ok = len(p.encoder_batches) == 1 and len(p.encoder_batches[0][1]) == n_items
        if not ok or p.n_rows != expected.shape[0] or len(p.segments) != n_items:
            failures.append(f"plan_step ({'hits' if all_hits else 'misses'}): unexpected plan shape")

    def check_embed(all_hits: bool) -> None:
        res = state["out"]
        rep = res.report
        want = (0, 0, n_items) if all_hits else (1, n_items, 0)
        if (rep.encoder_calls, rep.items_encoded, rep.cache_hits) != want:
            failures.append(f"embed_chunk ({'hits' if all_hits else 'misses'}): report {rep}, expected {want}")
        if not torch.equal(res.embedding, expected):
            failures.append(f"embed_chunk ({'hits' if all_hits else 'misses'}): rows differ from the naive reference")

    cases = [
        ("plan_step", "all misses", plan, fresh_cache, lambda: check_plan(False), 0.0),
        ("plan_step", "all hits", plan, warm, lambda: check_plan(True), 0.0),
        ("embed_chunk (no-op encoder)", "all misses", embed, fresh_cache, lambda: check_embed(False), copied_mb),
        ("embed_chunk", "all hits", embed, warm, lambda: check_embed(True), copied_mb),
    ]
    rows = []
    for name, cache_state, step, prepare, check, mb in cases:
        wall, cpu = median_us(step, prepare, repeats)
        before = len(failures)
        check()
        rows.append(
            [
                name,
                cache_state,
                f"{cpu / n_items:.2f}",
                f"{wall / n_items:.2f}",
                f"{cpu / 1e3:,.1f}",
                f"{mb:.1f}",
                "PASS" if len(failures) == before else "FAIL",
            ]
        )
    return rows, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 requests, 3 repeats, no results file")
    parser.add_argument("--requests", type=int, default=None, help="requests per step (default 256)")
    parser.add_argument("--images", type=int, default=4, help="images per request")
    parser.add_argument("--rows", type=int, default=729, help="placeholder rows per image")
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per case (default 21)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave results/schedule.md alone")
    args = parser.parse_args(argv)
    n_requests = args.requests or (16 if args.quick else 256)
    repeats = args.repeats or (3 if args.quick else 21)

    requests = build_requests(n_requests, args.images, args.rows, args.hidden)
    n_items = n_requests * args.images
    load_before = load_average()
    rows, failures = run_cases(requests, repeats)
    load_after = load_average()

    headers = ["case", "cache", "CPU µs per item", "wall µs per item", "CPU ms per step", "MB copied", "check"]
    table = markdown_table(headers, rows)
    verdict = "PASS" if not failures else "FAIL"
    body = "\n".join(
        [
            "## Host planning overhead (`bench_schedule.py`)",
            "",
            *environment_lines(),
            f"- step: {n_requests} requests x {args.images} images = {n_items} items, {args.rows} rows per image,"
            f" hidden {args.hidden}, whole prompts in one window; medians of {repeats} steps after one warm-up",
            f"- host load average (1 min) before / after: {load_before} / {load_after};"
            " CPU time is this process's, wall time includes time spent descheduled",
            "- assembly on CPU: the scheduler's packed path (every source whole: one `torch.cat`, or the C helper's"
            " streaming append for results of 4 MiB or more)",
            "",
            table,
            "",
            "No peer column: SGLang's own code runs side by side with ours in `bench_vs_sglang.py`",
            "(`vs_sglang.md`), and its per-request encoding against ours in the encoder-batching section.",
            "",
            f"check: {verdict}",
        ]
    )
    print(body)
    for failure in failures:
        print(f"FAIL: {failure}")
    if not args.quick and not args.no_write and not failures:
        write_section("bench_schedule", body)
        print(f"\nwrote {RESULTS}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
