"""One prefill step's vision encoding: one encoder call per request vs one per step.

Peer: SGLang's per-request encoding. On HIP, NPU and XPU SGLang 0.5.19 encodes each
request's cache misses in its own encoder call (``_get_chunked_embedding_by_item``);
mm_schedule's default, on every backend, is one call for the misses of the whole step.
Both sides here run the same items through the same real architecture (SigLIP
so400m-patch14 + LLaVA projector, random weights from the config, see
``vision_encoder.py``) and through the same scheduler; only the grouping differs:

* per request: ``embed_chunk([request])`` for each request in turn (one encoder call per
  request, rows concatenated in request order), as the by-item path does;
* across requests: ``embed_chunk(all requests)`` (one encoder call).

Every image is distinct and every cache starts empty, so both sides encode exactly the
same images; the outputs are compared (bit-exact when they are, otherwise within the
stated tolerance), and the encoder calls are counted. Repeats alternate which side runs
first. The ratio is per-request time / across-requests time from this one run.

    python benchmarks/bench_encoder_batching.py            # ~1.5 min on 2 idle CPU cores
    python benchmarks/bench_encoder_batching.py --quick    # seconds; no results file
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_schedule import environment_lines, image_requests, markdown_table, write_section
from vision_encoder import VisionEncoder, small_shape

from mm_schedule import EmbeddingCache, MMItem, RequestChunk, StepContext, embed_chunk

TEXT_GAP = 20
# Batched and single-image matmuls may round differently in the last bits, so "equal"
# means bit-exact or within the encoder's reorder tolerance (reported separately).
NO_ACK = StepContext(on_cache_hit=None)


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def build_requests(encoder: VisionEncoder, n_requests: int, images: int, seed: int) -> list[RequestChunk]:
    gen = torch.Generator().manual_seed(seed)
    return image_requests(n_requests, images, encoder.shape.tokens_per_image, text_gap=TEXT_GAP,
                          feature=lambda: encoder.random_image(gen),
                          item_hash=lambda r, i: seed * 1_000_000 + r * 100 + i + 1)


def across_requests(encoder: VisionEncoder, requests: list[RequestChunk]) -> torch.Tensor:
    cache = EmbeddingCache(1 << 40)
    return embed_chunk(requests, encoder, cache=cache, context=NO_ACK).embedding


def per_request(encoder: VisionEncoder, requests: list[RequestChunk]) -> torch.Tensor:
    cache = EmbeddingCache(1 << 40)
    pieces = [embed_chunk([req], encoder, cache=cache, context=NO_ACK).embedding for req in requests]
    return torch.cat(pieces)


def timed(fn, encoder: VisionEncoder, requests: list[RequestChunk]) -> tuple[float, float, torch.Tensor, int]:
    """Wall seconds, process CPU seconds (all torch threads), output, encoder calls."""
    calls_before = encoder.calls
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(encoder, requests)
    return time.perf_counter() - wall, time.process_time() - cpu, out, encoder.calls - calls_before


def run_case(encoder: VisionEncoder, n_requests: int, images: int, repeats: int, seed: int) -> tuple[list, list[str]]:
    requests = build_requests(encoder, n_requests, images, seed)
    sides = {"per request": per_request, "across requests": across_requests}
    times: dict[str, list[float]] = {name: [] for name in sides}
    cpu_times: dict[str, list[float]] = {name: [] for name in sides}
    outputs: dict[str, torch.Tensor] = {}
    calls: dict[str, int] = {}
    for rep in range(repeats):
        order = list(sides) if rep % 2 == 0 else list(reversed(sides))
        for name in order:
            seconds, cpu, out, n_calls = timed(sides[name], encoder, requests)
            times[name].append(seconds)
            cpu_times[name].append(cpu)
            outputs[name], calls[name] = out, n_calls

    failures = []
    a, b = outputs["per request"], outputs["across requests"]
    expected_rows = n_requests * images * encoder.shape.tokens_per_image
    if a.shape != b.shape or a.shape[0] != expected_rows:
        failures.append(f"{n_requests}x{images}: shapes {tuple(a.shape)} / {tuple(b.shape)}, expected {expected_rows} rows")
        max_diff, exact, close = float("nan"), False, False
    else:
        exact = torch.equal(a, b)
        max_diff = (a - b).abs().max().item()
        close = torch.allclose(a, b, rtol=0, atol=encoder.reorder_tolerance(a))
        if not close:
            failures.append(f"{n_requests}x{images}: outputs differ, max |diff| {max_diff:.3g}")
    if calls != {"per request": n_requests, "across requests": 1}:
        failures.append(f"{n_requests}x{images}: encoder calls {calls}, expected {n_requests} and 1")

    t_req = statistics.median(times["per request"])
    t_all = statistics.median(times["across requests"])
    c_req = statistics.median(cpu_times["per request"])
    c_all = statistics.median(cpu_times["across requests"])
    row = [
        f"{n_requests} x {images}",
        n_requests * images,
        expected_rows,
        f"{calls['per request']} / {calls['across requests']}",
        f"{t_req * 1e3:,.0f}",
        f"{t_all * 1e3:,.0f}",
        f"**{t_req / t_all:.2f}x**",
        f"{c_req * 1e3:,.0f} / {c_all * 1e3:,.0f}",
        f"{c_req / c_all:.2f}x",
        "bit-exact" if exact else f"allclose, max diff {max_diff:.2g}",
        "PASS" if not failures else "FAIL",
    ]
    return row, failures


def parse_cases(text: str) -> list[tuple[int, int]]:
    cases = []
    for part in text.split(","):
        try:
            n, k = part.lower().split("x")
            cases.append((int(n), int(k)))
        except ValueError:
            raise SystemExit(f"--cases: {part!r} is not REQUESTSxIMAGES (e.g. 8x1)") from None
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny cases, one repeat, no results file")
    parser.add_argument("--cases", default=None, help="REQUESTSxIMAGES list (default 8x1,16x2)")
    parser.add_argument("--layers", type=int, default=None, help="encoder layers (default 2 of 27)")
    parser.add_argument("--image-size", type=int, default=None, help="pixels per side (default 224)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per side (default 3)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave results/schedule.md alone")
    args = parser.parse_args(argv)
    cases = parse_cases(args.cases or ("2x1,2x2" if args.quick else "8x1,16x2"))
    shape = small_shape(
        num_layers=args.layers or (1 if args.quick else 2),
        image_size=args.image_size or (56 if args.quick else 224),
    )
    repeats = args.repeats or (1 if args.quick else 3)
    load = load_average()

    started = time.perf_counter()
    encoder = VisionEncoder(shape)
    encoder([MMItem(hash=0, offsets=[(0, 0)], feature=encoder.random_image(torch.Generator()))])  # warm-up
    rows, failures = [], []
    for seed, (n_requests, images) in enumerate(cases, start=1):
        row, case_failures = run_case(encoder, n_requests, images, repeats, seed)
        rows.append(row)
        failures += case_failures
        print(f"  {n_requests}x{images} done ({time.perf_counter() - started:.0f} s)", flush=True)

    headers = [
        "requests x images", "images", "rows", "encoder calls (per request / across)",
        "per request ms", "across requests ms", "ratio (wall)",
        "CPU ms (per request / across)", "ratio (CPU)", "outputs", "check",
    ]
    verdict = "PASS" if not failures else "FAIL"
    body = "\n".join(
        [
            "## Encoder batching: per request vs across requests (`bench_encoder_batching.py`)",
            "",
            *environment_lines(),
            f"- encoder: {shape.describe()}; float32, random weights (seed 0), nothing downloaded",
            f"- each side: fresh empty cache, every image distinct, whole prompts in one window;"
            f" medians of {repeats} runs, sides alternating; host load average (1 min) before / after:"
            f" {load:.2f} / {load_average():.2f}",
            "- ratio = per-request time / across-requests time (above 1: batching across requests is faster);"
            " wall time decides; CPU time (this process, all torch threads) is shown because the two cores"
            " are shared and it is far less disturbed by other processes;"
            " outputs compared bit for bit, else within the bound on reordered sums"
            " (`mm_schedule.tolerance.reorder_tolerance`: layers x fan-in x eps x max |output|)",
            "",
            markdown_table(headers, rows),
            "",
            "Per request is how SGLang 0.5.19 encodes on HIP, NPU and XPU (one encoder call per request's",
            "misses); across requests is mm_schedule's default on every backend. These numbers are from the",
            "CPU named above only; GPU numbers have not been measured.",
            "",
            f"check: {verdict}",
        ]
    )
    print(body)
    for failure in failures:
        print(f"FAIL: {failure}")
    if not args.quick and not args.no_write and not failures:
        write_section("bench_encoder_batching", body)
        print(f"\nwrote {Path(__file__).resolve().parent / 'results' / 'schedule.md'}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
