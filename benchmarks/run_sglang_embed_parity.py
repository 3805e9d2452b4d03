"""SGLang's own ``embed_mm_inputs`` of each release, with and without ``install()``: the
``input_embeds`` of every chunked step must be bit-identical.

    python benchmarks/run_sglang_embed_parity.py [--releases 0.5.18,0.5.23] [--seeds 4]
        [--out benchmarks/results/sglang_embed_parity.md]

Each release's real modules are loaded from its wheel on CPU (``_sglang_process``). Per
seed, a batch of 1 to 4 requests (images of one span, some shared between requests, and
videos of several spans) is prefilled in chunks: once on SGLang's own module, once with
the stand-in installed (bound as that release), each from a fresh cache of the same
size, with encoded and with precomputed embeddings. The table counts the steps whose
``input_embeds`` are bit-identical and whether both caches end with the same keys. The
run fails (exit 1) on any difference.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _sglang_process as proc

HIDDEN = 8
VOCAB = 128
Item, Modality = proc.MultimodalDataItem, proc.Modality
PADS = {Modality.IMAGE: 99, Modality.VIDEO: 98}


def item_rows(item) -> torch.Tensor:
    gen = torch.Generator().manual_seed(item.hash)
    return torch.randn(sum(e - s + 1 for s, e in item.offsets), HIDDEN, generator=gen)


def encoder(items):
    return [item_rows(item) for item in items]


def _request(rng: random.Random, r: int):
    """Token ids and items of one prompt: images (one span each) and maybe a video of several spans."""
    ids, items = [], []

    def text(n):
        ids.extend(rng.randrange(1, 90) for _ in range(n))

    text(rng.randint(0, 3))
    for k in range(rng.randint(0, 3)):
        n = rng.randint(1, 8)
        items.append(Item(modality=Modality.IMAGE, hash=100 * (r % 2) + k, offsets=[(len(ids), len(ids) + n - 1)],
                          pad_value=PADS[Modality.IMAGE], feature=torch.zeros(1)))
        ids.extend([PADS[Modality.IMAGE]] * n)
        text(rng.randint(0, 3))
    if rng.random() < 0.6:
        spans = []
        for _ in range(rng.randint(2, 4)):
            n = rng.randint(1, 5)
            spans.append((len(ids), len(ids) + n - 1))
            ids.extend([PADS[Modality.VIDEO]] * n)
            text(rng.randint(1, 2))
        items.append(Item(modality=Modality.VIDEO, hash=5000 + r, offsets=spans, pad_value=PADS[Modality.VIDEO],
                          feature=torch.zeros(1)))
    text(rng.randint(1, 3))
    return ids, items


def steps(seed: int, precomputed: bool):
    """``(mm_inputs_list, prefixes, extends, input_ids)`` of each chunked step (new item
    objects every step, as SGLang's scheduler hands them over)."""
    rng = random.Random(seed)
    prompts = [_request(rng, r) for r in range(rng.randint(1, 4))]
    if precomputed:
        for _, items in prompts:
            for item in items:
                item.precomputed_embeddings = item_rows(item)
    chunk = [rng.randint(4, 14) for _ in prompts]
    done = [0] * len(prompts)
    while any(d < len(ids) for d, (ids, _) in zip(done, prompts)):
        inputs, prefixes, extends, tokens = [], [], [], []
        for i, (ids, items) in enumerate(prompts):
            if done[i] >= len(ids):
                continue
            ext = min(chunk[i], len(ids) - done[i])
            inputs.append(types.SimpleNamespace(mm_items=[
                Item(modality=it.modality, hash=it.hash, offsets=list(it.offsets), pad_value=it.pad_value,
                     feature=it.feature, precomputed_embeddings=it.precomputed_embeddings) for it in items]))
            prefixes.append(done[i])
            extends.append(ext)
            tokens += ids[done[i]: done[i] + ext]
            done[i] += ext
        yield inputs, prefixes, extends, torch.tensor(tokens)


def embed(mm_utils, step, table):
    inputs, prefixes, extends, tokens = step
    embeds, _ = mm_utils.embed_mm_inputs(
        mm_inputs_list=inputs, extend_prefix_lens=prefixes, extend_seq_lens=extends, input_ids=tokens.clone(),
        input_embedding=table, data_embedding_func_mapping={Modality.IMAGE: encoder, Modality.VIDEO: encoder},
    )
    return embeds


def compare(version: str, seeds: int) -> list[dict]:
    """One row per (seed, encoded/precomputed) for one release."""
    from mm_schedule.integrations.sglang import install, standin, uninstall

    rows = []
    process = proc.SGLangProcess(version)
    with process:
        mm_utils = sys.modules["sglang.srt.managers.mm_utils"]
        for precomputed in (False, True):
            for seed in range(seeds):
                table = torch.nn.Embedding(VOCAB, HIDDEN)
                process.scheduler.init_mm_embedding_cache(1 << 30)
                expected = [embed(mm_utils, step, table) for step in steps(seed, precomputed)]
                report = install()
                try:
                    standin.init_mm_embedding_cache(1 << 30)
                    got = [embed(mm_utils, step, table) for step in steps(seed, precomputed)]
                    theirs, ours = process.scheduler.embedding_cache.mm_cache, standin.embedding_cache
                    same_keys = len(ours) == len(theirs) and all(ours.has(key) for key in theirs)
                finally:
                    uninstall()
                identical = sum(a.shape == b.shape and torch.equal(a, b) for a, b in zip(expected, got))
                rows.append(dict(release=version, bound=report.release, seed=seed,
                                 kind="precomputed" if precomputed else "encoded", steps=len(expected),
                                 identical=identical if len(got) == len(expected) else 0,
                                 tokens=sum(int(e.shape[0]) for e in expected), same_keys=same_keys))
    return rows


def table(rows: list[dict], backend: str) -> str:
    lines = [
        "# SGLang's embed_mm_inputs with and without install(), per release",
        "",
        f"Produced on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} by"
        " `python benchmarks/run_sglang_embed_parity.py` on CPU"
        f" (torch {torch.__version__}, Python {sys.version.split()[0]}, assembly backend {backend}).",
        "Each release's modules come from its official wheel; the stand-in is bound as that release.",
        "",
        "| SGLang | stand-in as | embeddings | seed | steps | bit-identical steps | tokens | same cache keys |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        keys = ("yes" if r["same_keys"] else "**no**") if r["kind"] == "encoded" else "(nothing cached)"
        lines.append(f"| {r['release']} | {r['bound']} | {r['kind']} | {r['seed']} | {r['steps']} |"
                     f" {r['identical']} | {r['tokens']} | {keys} |")
    bad = [r for r in rows if r["identical"] != r["steps"] or (r["kind"] == "encoded" and not r["same_keys"])]
    lines += ["", f"{sum(r['steps'] for r in rows)} steps, {sum(r['identical'] for r in rows)} bit-identical; "
              + ("every step of every release identical." if not bad else f"{len(bad)} rows differ.")]
    return "\n".join(lines) + "\n"


def main() -> int:
    from mm_schedule.integrations.sglang import KNOWN

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default=",".join(KNOWN))
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="write the table here (default: print it)")
    args = parser.parse_args()
    rows = [row for version in args.releases.split(",") for row in compare(version, args.seeds)]
    text = table(rows, os.environ.get("MM_SCHEDULE_KERNEL_BACKEND", "auto"))
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0 if text.rstrip().endswith("identical.") else 1


if __name__ == "__main__":
    raise SystemExit(main())
