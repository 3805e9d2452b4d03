"""Encoder data parallelism across ranks: step time with 1, 2 and 4 ranks.

Each rank is a process of one gloo group on this machine, with one torch thread (so N
ranks use N cores; on a machine with fewer cores than ranks the ranks share them and
the numbers say so). Every rank holds the same real vision tower (SigLIP so400m-patch14
architecture + LLaVA projector, random weights from one seed, see
``vision_encoder.py``) and schedules the same step: R requests x I distinct images,
every one a cache miss (fresh caches every step).

Two modes per group size, run side by side in this one invocation:

* ``every rank encodes``: today's engines (and mm_schedule without
  ``encoder_parallel``): each rank encodes every miss itself, after the ranks agree on
  the miss set;
* ``encoder parallel``: the misses are split across the ranks by token count, each
  encodes its share, the rows are exchanged.

The step time of a run is the slowest rank's (all ranks start each step together,
after a barrier); the table gives the median over the measured steps and the ratio to
one rank. Every rank's output is compared with the one-rank output of the same step.

    python benchmarks/bench_ranks.py            # writes benchmarks/results/ranks.md
    python benchmarks/bench_ranks.py --quick    # seconds; no results file
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_schedule import environment_lines, image_requests, markdown_table
from vision_encoder import VisionEncoder, small_shape

from mm_schedule import EmbeddingCache, MMItem, RequestChunk, StepContext, embed_chunk

RESULTS = Path(__file__).resolve().parent / "results" / "ranks.md"
TEXT_GAP = 16
# Different batch compositions may round differently in the last bits (batched GEMMs);
# "same" below means bit-exact, or within the encoder's reorder tolerance when it says so.


def build_step(encoder: VisionEncoder, step: int, n_requests: int, images: int) -> list[RequestChunk]:
    gen = torch.Generator().manual_seed(1_000 + step)
    return image_requests(n_requests, images, encoder.shape.tokens_per_image, text_gap=TEXT_GAP,
                          feature=lambda: encoder.random_image(gen),
                          item_hash=lambda r, i: (step * 1_000 + r * images + i + 1) * 1_000_003)


HIT_ITEMS, HIT_ROWS, HIT_HIDDEN = 1024, 4, 64


def hit_step() -> list[RequestChunk]:
    """256 requests x 4 one-span items, the steady state of a serving step once cached."""
    requests = []
    for r in range(HIT_ITEMS // 4):
        items = [
            MMItem(hash=7_000_000 + 4 * r + i, offsets=[(8 * i, 8 * i + HIT_ROWS - 1)], feature=None)
            for i in range(4)
        ]
        requests.append(RequestChunk(items=items, prefix=0, extend=32))
    return requests


def constant_encoder(items: list) -> torch.Tensor:
    return torch.ones(len(items) * HIT_ROWS, HIT_HIDDEN)


def rank_main(rank: int, world: int, parallel: bool, config: dict, rendezvous: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    group = None
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=timedelta(minutes=10)
        )
        group = dist.group.WORLD
    encoder = VisionEncoder(small_shape(), seed=0)
    context = StepContext(group=group, encoder_parallel=parallel, on_cache_hit=None)
    times, outputs = [], []
    for step in range(config["warmup"] + config["steps"]):
        requests = build_step(encoder, step, config["requests"], config["images"])
        cache = EmbeddingCache(1 << 30)
        if group is not None:
            dist.barrier(group)
        start = time.perf_counter()
        result = embed_chunk(requests, encoder, cache=cache, context=context)
        elapsed = time.perf_counter() - start
        if step >= config["warmup"]:
            times.append(elapsed)
            outputs.append(result.embedding)
    # Host cost of agreeing: an all-hit step of many small items, every cache warm.
    requests, cache = hit_step(), EmbeddingCache(1 << 30)
    embed_chunk(requests, constant_encoder, cache=cache, context=context)
    hit_times = []
    for _ in range(config["hit_steps"]):
        if group is not None:
            dist.barrier(group)
        start = time.perf_counter()
        embed_chunk(requests, constant_encoder, cache=cache, context=context)
        hit_times.append(time.perf_counter() - start)
    record = {"times": times, "images": encoder.items_seen, "outputs": outputs, "hit_times": hit_times}
    torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
    if group is not None:
        dist.barrier(group)
        dist.destroy_process_group()


def run(world: int, parallel: bool, config: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            rank_main,
            args=(world, parallel, config, os.path.join(tmp, "rendezvous"), tmp),
            nprocs=world,
            start_method="spawn",
        )
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def compare(records: list[dict], reference: list[torch.Tensor], encoder: VisionEncoder) -> str:
    exact = close = True
    for rec in records:
        for got, want in zip(rec["outputs"], reference):
            exact &= torch.equal(got, want)
            close &= torch.allclose(got, want, rtol=0, atol=encoder.reorder_tolerance(want))
    if exact:
        return "bit-exact"
    return "within the reorder tolerance" if close else "FAIL"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny run, 1 and 2 ranks, no results file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as every rank does; the environment lines report it
    worlds = (1, 2) if args.quick else (1, 2, 4)
    config = {
        "requests": 2 if args.quick else 4,
        "images": 1 if args.quick else 2,
        "warmup": 0 if args.quick else 1,
        "steps": 1 if args.quick else 5,
        "hit_steps": 3 if args.quick else 21,
    }
    shape = small_shape()
    tolerance_of = VisionEncoder(shape, seed=0)  # the ranks' encoder: same shape, same seed
    load_before = os.getloadavg()[0]
    rows, failed = [], False
    baseline = reference = None
    for world in worlds:
        redundant_ms = None
        for parallel in (False, True) if world > 1 else (False,):
            records = run(world, parallel, config)
            slowest = [max(rec["times"][i] for rec in records) for i in range(config["steps"])]
            median_ms = statistics.median(slowest) * 1e3
            hit_ms = statistics.median(
                max(rec["hit_times"][i] for rec in records) for i in range(config["hit_steps"])
            ) * 1e3
            if reference is None:
                reference, baseline = records[0]["outputs"], median_ms
            check = compare(records, reference, tolerance_of)
            failed |= check == "FAIL"
            steps = config["warmup"] + config["steps"]
            per_rank = "/".join(f"{rec['images'] / steps:g}" for rec in records)
            mode = "encoder parallel" if parallel else "every rank encodes"
            over_redundant = f"{redundant_ms / median_ms:.2f}x" if parallel else "–"
            redundant_ms = median_ms
            rows.append(
                [world, mode, f"{median_ms:.0f}", per_rank, f"{baseline / median_ms:.2f}x", over_redundant, check,
                 f"{hit_ms:.1f}"]
            )
            print(f"{world} rank(s), {mode}: {median_ms:.0f} ms per step, images per rank {per_rank}, {check}", flush=True)
    load_after = os.getloadavg()[0]
    images = config["requests"] * config["images"]
    lines = [
        "# Encoder data parallelism across ranks (`bench_ranks.py`)",
        "",
        *environment_lines(),
        "- one process per rank, one torch thread per rank, gloo on CPU (loopback); "
        f"{os.cpu_count()} CPU cores on this machine",
        f"- encoder: {shape.describe()}, float32, random weights (seed 0), the same on every rank",
        f"- step: {config['requests']} requests x {config['images']} images = {images} distinct images, "
        f"{images * shape.tokens_per_image} rows, all cache misses; median of {config['steps']} steps after "
        f"{config['warmup']} warm-up, each step's time is its slowest rank's",
        f"- all-hit step: {HIT_ITEMS} one-span items of {HIT_ROWS} rows, hidden {HIT_HIDDEN}, every cache warm; "
        f"median of {config['hit_steps']} steps, slowest rank (the host cost of agreeing across ranks)",
        f"- host load average (1 min) before / after: {load_before:.2f} / {load_after:.2f}",
        "",
        markdown_table(
            [
                "ranks", "mode", "step ms", "images encoded per rank per step", "speed-up vs 1 rank",
                "speed-up vs every rank encoding", "output vs 1 rank", "all-hit step ms",
            ],
            rows,
        ),
        "",
        "Speed-up vs 1 rank = one rank's step time / this row's (the scaling ratio). Speed-up vs every",
        "rank encoding = the same group size without encoder parallelism / with it. With fewer free",
        "cores than ranks the ranks share cores, and no split can beat the number of cores actually free.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    print("check: FAIL" if failed else "check: PASS")
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
