"""mm_schedule demo: chunked prefill of real VLM architectures through the transformers adapter.

Two tiny random-weight models from transformers (nothing downloaded): Qwen2-VL
(variable-size images as patch rows plus grids, and a video) and LLaVA with a SigLIP
tower. Four requests share images; one joins at step 2. Every step prefills at most
CHUNK tokens of each request, so images are cut by chunk boundaries.

Per step it prints the encoder calls, items encoded, cache hits and multimodal rows
of the step (checked against counts worked out independently), and the encoder calls
the per-request path needs for the same step. When a request is fully prefilled, its
assembled input embeddings are checked bit for bit against the model's own merge of the
rows the steps encoded, and to rounding against the model's own merge of its own
per-request encode; its last-token logits (decoder run chunk by chunk over a KV cache)
against the model's own unchunked forward.

It then times the multimodal path of every step, ours against the per-request path,
and plots host time per step to examples/output/host_time_per_step.png.

    python examples/demo.py                          # `make demo`; exits 1 if any check fails
    python examples/demo.py --checks-only --threads 1   # the checks alone, in seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import (
    RecordingEncoder,
    Request,
    batched_step,
    decode_chunk,
    per_request_step,
    schedule,
)
from tiny_vlms import TinyVLM, reorder_tolerance

from mm_schedule import EmbeddingCache
from mm_schedule.integrations.transformers import VisionAdapter

CHUNK = 24
TIMING_REPEATS = 15
OUTPUT = Path(__file__).resolve().parent / "output" / "host_time_per_step.png"


def build_requests(vlm: TinyVLM) -> list[Request]:
    gen = torch.Generator().manual_seed(2024)
    grids = ((1, 4, 8), (1, 6, 6), (1, 4, 12), (1, 8, 8), (1, 4, 4), (1, 6, 10), (1, 8, 12))
    a, b, c, d, e, f, g = (vlm.image(gen, grid) for grid in grids)  # Qwen: 8 to 24 rows each
    video = [vlm.image(gen, (2, 4, 4), video=True)] if vlm.qwen else []
    return [
        Request("R0", vlm.prompt([2, a, 4, b, 6, c, 3], gen)),
        Request("R1", vlm.prompt([3, a, 5, d, 4, *video, 2], gen)),  # a again: encoded once
        Request("R2", vlm.prompt([1, e, 30, b, 3], gen)),
        Request("R3", vlm.prompt([4, f, 6, c, 5], gen)),
        Request("R4", vlm.prompt([3, d, 4, e, 8, g, 2], gen), arrives=2),  # joins later; d and e cached
    ]


def expected_counts(plan, seen: set[int]) -> tuple[int, int, int, int]:
    """(calls, items encoded, cache hits, rows) an ideal scheduler has for this step,
    given the hashes encoded in earlier steps; updates ``seen``."""
    new, hits, rows = {}, set(), 0
    for r, p, e in plan:
        for item in r.items:
            (s, end), = item.offsets
            overlap = min(end, p + e - 1) - max(s, p) + 1
            if overlap <= 0:
                continue
            rows += overlap
            if item.hash in seen:
                hits.add(item.hash)
            else:
                new.setdefault(item.hash, item.modality)
    seen.update(new)
    return len(set(new.values())), len(new), len(hits), rows


def compare(got: torch.Tensor, want: torch.Tensor, tolerance: float) -> tuple[bool, str]:
    if got.shape != want.shape:
        return False, f"shape {tuple(got.shape)} vs {tuple(want.shape)}"
    if torch.equal(got, want):
        return True, "bit-exact"
    diff = (got - want).abs().max().item()
    return diff <= tolerance and not torch.isnan(got).any(), f"max |diff| {diff:.1e} (tolerance {tolerance:.1e})"


def serve(vlm: TinyVLM) -> bool:
    """Prefill every request chunk by chunk, printing each step; check every request."""
    model = vlm.model
    adapter = VisionAdapter(model, model_id=f"tiny-{vlm.kind}")
    requests = build_requests(vlm)
    for r in requests:
        r.items = adapter.items(r.inputs)
        names = ", ".join(f"{it.modality.lower()} {it.offsets[0][0]}..{it.offsets[0][1]}" for it in r.items)
        joins = f", joins at step {r.arrives}" if r.arrives > 1 else ""
        print(f"  {r.name}: {r.length} tokens{joins}; {names}")
    positions = {r.name: vlm.forward_kwargs(r.inputs).get("position_ids") for r in requests}
    cache, per_request_cache = EmbeddingCache(16 << 20), EmbeddingCache(16 << 20)
    recorder = RecordingEncoder(adapter)
    per_request_diff, per_request_tolerance = 0.0, 0.0
    print(f"\n  {'step':<5}{'windows':<52}{'calls':>6}{'items':>6}{'hits':>6}{'rows':>6}{'per-request calls':>19}")
    ok, step, seen = True, 1, set()
    while plan := schedule(requests, step, CHUNK):
        pieces, report, _ = batched_step(adapter, cache, plan, recorder)
        theirs, per_request_calls, _ = per_request_step(adapter, per_request_cache, plan)
        windows = " ".join(f"{r.name}[{p},{p + e})" for r, p, e in plan)
        got = (report.encoder_calls, report.items_encoded, report.cache_hits, report.rows)
        want = expected_counts(plan, seen)
        print(f"  {step:<5}{windows:<52}{got[0]:>6}{got[1]:>6}{got[2]:>6}{got[3]:>6}{per_request_calls:>19}")
        if got != want:
            ok = False
            print(f"  FAIL step {step}: (calls, items, hits, rows) = {got}, expected {want}")
        # The per-request path encodes each request's images in a batch of their own:
        # the same rows up to the rounding of a reordered sum, not bit for bit.
        for ours, per_request in zip(pieces, theirs):
            tolerance = reorder_tolerance(vlm.vision, per_request)
            same, _ = compare(ours, per_request, tolerance)
            if not same:
                ok = False
                print(f"  FAIL step {step}: the per-request path assembled different rows")
            per_request_diff = max(per_request_diff, (ours - per_request).abs().max().item())
            per_request_tolerance = max(per_request_tolerance, tolerance)
        for (r, p, e), embeds in zip(plan, pieces):
            r.embeds.append(embeds)
            decode_chunk(model, r, embeds, p, positions[r.name])
            r.prefilled += e
        step += 1
    how = "bit-exact" if per_request_diff == 0 else f"max |diff| {per_request_diff:.1e} (tolerance {per_request_tolerance:.1e})"
    print(f"  every step's rows vs the per-request path's: {how}\n")
    for r in requests:
        ok &= check_request(vlm, r, recorder.request_rows(r.items))
    stats = cache.stats()
    print(f"  cache: {stats.entries} entries, {stats.bytes / 1024:.0f} KiB, {stats.hits} hits, {stats.misses} misses")
    return ok


def check_request(vlm: TinyVLM, r: Request, encoded: dict[str, torch.Tensor]) -> bool:
    """``encoded``: the rows the steps' encoder calls returned for ``r``'s items. Assembly
    copies them, so the model's merge of those rows must come out bit for bit. The model's
    own per-request encode batches the request's images alone, unlike the steps, so its rows
    (and the logits) agree to the rounding of reordered sums (``reorder_tolerance``)."""
    assembled = torch.cat(r.embeds)
    with torch.no_grad():
        own_embeds = vlm.reference_embeds(r.inputs)[0]
        own_logits = vlm.model(**r.inputs).logits[0, -1]
    checks = (
        ("input embeddings vs the model's merge of the encoded rows",
         compare(assembled, vlm.merge_rows(r.inputs, encoded)[0], 0.0)),
        ("input embeddings vs the model's own merge",
         compare(assembled, own_embeds, reorder_tolerance(vlm.vision, own_embeds))),
        ("last-token logits vs the model's unchunked forward",
         compare(r.last_logits, own_logits, reorder_tolerance([vlm.model], own_logits))),
    )
    for what, (passed, how) in checks:
        print(f"  {'PASS' if passed else 'FAIL'}  {r.name} {what}: {how}")
    return all(passed for _, (passed, _) in checks)


def time_steps(vlm: TinyVLM) -> tuple[list[float], list[float]]:
    """Host time (ms) of each step's multimodal path, ours and per-request: the whole
    schedule replayed from empty caches ``TIMING_REPEATS`` times, alternating the two,
    and the fastest run of each step kept (other processes only ever add time)."""
    adapter = VisionAdapter(vlm.model, model_id=f"tiny-{vlm.kind}")
    ours: list[list[float]] = []
    theirs: list[list[float]] = []
    for _ in range(TIMING_REPEATS):
        for step_fn, samples in ((batched_step, ours), (per_request_step, theirs)):
            requests = build_requests(vlm)
            for r in requests:
                r.items = adapter.items(r.inputs)
            cache, step = EmbeddingCache(16 << 20), 1
            while plan := schedule(requests, step, CHUNK):
                elapsed = step_fn(adapter, cache, plan)[-1]
                if len(samples) < step:
                    samples.append([])
                samples[step - 1].append(elapsed * 1e3)
                for r, _, e in plan:
                    r.prefilled += e
                step += 1
    return [min(s) for s in ours], [min(s) for s in theirs]


def plot(timings: dict[str, tuple[list[float], list[float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(timings), figsize=(5 * len(timings), 3.6), squeeze=False)
    for ax, (name, (ours, theirs)) in zip(axes[0], timings.items()):
        steps = range(1, len(ours) + 1)
        ax.plot(steps, theirs, "o-", label="per-request path (one encoder call per request)")
        ax.plot(steps, ours, "s-", label="mm_schedule (one encoder call per step)")
        ax.set_title(name)
        ax.set_xlabel("prefill step")
        ax.set_ylabel("host time of the multimodal path (ms)")
        ax.set_xticks(list(steps))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"Chunked prefill, {CHUNK} tokens per request per step (fastest of {TIMING_REPEATS} runs)")
    fig.tight_layout()
    OUTPUT.parent.mkdir(exist_ok=True)
    fig.savefig(OUTPUT, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks-only", action="store_true", help="serve and check; skip the timing and the plot")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: at most 2)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(args.threads or min(torch.get_num_threads(), 2))
    print("mm_schedule demo: chunked prefill through the transformers adapter (tiny random-weight models)")
    print(f"{CHUNK} tokens of each request per step; {torch.get_num_threads()} torch threads.")
    print("Assembly copies the rows the encoder returned: input embeddings must equal the model's merge of")
    print("those rows bit for bit. The model's own forward encodes each request's images alone, where a step")
    print("batches several requests' images, and a matrix product may round its last bits differently for")
    print("another number of rows: against it, rows agree to rounding. Logits come from the decoder run chunk")
    print("by chunk over a KV cache (the unchunked forward's math, summed in another order): they agree to")
    print("rounding too. Qwen2-VL's M-RoPE positions depend on the whole prompt's grids: get_rope_index runs")
    print("once on the full prompt and each chunk takes its slice.\n")
    ok, timings = True, {}
    for kind, title in (("qwen2_vl", "Qwen2-VL"), ("llava_siglip", "LLaVA (SigLIP tower)")):
        vlm = TinyVLM(kind)
        print(f"== {title} ==")
        ok &= serve(vlm)
        if not args.checks_only:
            timings[title] = time_steps(vlm)
        print()
    if timings:
        print(f"host time of the multimodal path per step, fastest of {TIMING_REPEATS} runs, ms (ours / per-request):")
        for title, (ours, theirs) in timings.items():
            cells = "  ".join(f"{o:.1f}/{t:.1f}" for o, t in zip(ours, theirs))
            print(f"  {title:<22}{cells}")
        plot(timings)
        print(f"plot: {OUTPUT.relative_to(Path.cwd()) if OUTPUT.is_relative_to(Path.cwd()) else OUTPUT}")
    print(f"finished in {time.perf_counter() - started:.1f} s")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
