"""`make demo` and the planning benchmark run end to end and report success, and the
checks they print can fail."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# Generous: both normally finish in well under a minute together, but the two cores are shared.
TIMEOUT_S = 180


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )


def _load(relative: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def demo(monkeypatch):
    """examples/demo.py as a module, run in this process (no interpreter start-up, no
    second import of torch); the torch thread count it sets is restored afterwards."""
    pytest.importorskip("transformers")
    threads = torch.get_num_threads()
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    yield _load("examples/demo.py", "_demo_under_test")
    torch.set_num_threads(threads)


def test_demo_runs_and_passes(demo, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(demo, "TIMING_REPEATS", 1)  # timing and plot run; their numbers are not checked
    plot = ROOT / "examples" / "output" / "host_time_per_step.png"
    plot.unlink(missing_ok=True)
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == "PASS"
    assert "FAIL" not in out
    assert re.findall(r"^== (.+) ==$", out, re.M) == ["Qwen2-VL", "LLaVA (SigLIP tower)"]
    # Three checks (assembled rows, rows to rounding, logits) per request, five requests, two models.
    assert len(re.findall(r"^  PASS  R\d ", out, re.M)) == 3 * 5 * 2
    assert len(re.findall(r"input embeddings vs the model's merge of the encoded rows: bit-exact", out)) == 10
    assert len(re.findall(r"^  every step's rows vs the per-request path's: ", out, re.M)) == 2
    # step, windows..., calls, items, hits, rows, per-request calls
    table = re.findall(r"^  (\d+)\s+(?:R\d\[\d+,\d+\)\s+)+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", out, re.M)
    assert [row[0] for row in table] == ["1", "2", "3", "4"] * 2
    qwen_first, llava_first = table[0], table[4]
    # Step 1: every request's new images in one call, where the per-request path needs one per request.
    assert qwen_first[1:4] == ("1", "5", "0") and qwen_first[5] == "4"
    assert llava_first[1:4] == ("1", "4", "0") and llava_first[5] == "3"
    for last in (table[3], table[7]):  # the last step is served from the cache alone
        assert last[1:3] == ("0", "0") and int(last[3]) > 0
    assert plot.stat().st_size > 10_000


def test_demo_checks_allow_rounding_of_other_batches_but_no_changed_bit(demo, monkeypatch, capsys):
    """On another CPU or GPU a batch of several requests' images can round its last bits
    differently from each request's own batch: the demo must pass that. Assembly that
    changes one bit of one row (R0's first image row) must fail, though it is far inside
    every tolerance."""
    serving = sys.modules["serving"]
    from tiny_vlms import TinyVLM

    from mm_schedule.integrations.transformers import VisionAdapter

    encode, merge = VisionAdapter.__call__, serving.merge_chunk

    def rounds_by_batch_size(self, items):  # 4 units in the last place, for batches of several only
        rows = encode(self, items)
        return rows if len(items) == 1 else [r * (1 + 4 * torch.finfo(r.dtype).eps) for r in rows]

    def one_bit_off(embeds, chunks, encoder, **kwargs):
        result = merge(embeds, chunks, encoder, **kwargs)
        first = chunks[0]
        start = first.items[0].offsets[0][0] - first.prefix
        batched = isinstance(encoder, serving.RecordingEncoder)  # the per-request path stays right
        if batched and 0 <= start < first.extend:
            embeds[start, 0] = torch.nextafter(embeds[start, 0], torch.tensor(float("inf")))
        return result

    monkeypatch.setattr(VisionAdapter, "__call__", rounds_by_batch_size)
    monkeypatch.setattr(serving, "merge_chunk", one_bit_off)
    assert not demo.serve(TinyVLM("llava_siglip"))
    out = capsys.readouterr().out
    assert re.findall(r"^  FAIL  (.*):", out, re.M) == ["R0 input embeddings vs the model's merge of the encoded rows"]
    assert len(re.findall(r"^  PASS  R\d ", out, re.M)) == 3 * 5 - 1
    # The rounding did reach the compared rows.
    assert re.search(r"^  every step's rows vs the per-request path's: max \|diff\| [1-9]", out, re.M)
    assert re.search(r"^  PASS  R0 input embeddings vs the model's own merge: max \|diff\| [1-9]", out, re.M)


def test_planning_benchmark_quick_runs_and_passes():
    proc = _run("benchmarks/bench_schedule.py", "--quick")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "check: PASS" in out and "FAIL" not in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line.rstrip().endswith("| PASS |")]
    assert len(rows) == 4
    for line in rows:
        per_item = float(line.split("|")[4])
        assert per_item > 0


def test_planning_benchmark_check_catches_wrong_rows(monkeypatch):
    bench = _load("benchmarks/bench_schedule.py", "_bench_schedule_under_test")
    requests = bench.build_requests(n_requests=3, images=2, rows=5, hidden=4)
    rows, failures = bench.run_cases(requests, repeats=1)
    assert not failures and all(r[-1] == "PASS" for r in rows)

    monkeypatch.setattr(bench, "identity_encoder", lambda items: [it.feature + 1 for it in items])
    rows, failures = bench.run_cases(requests, repeats=1)
    assert any("differ from the naive reference" in f for f in failures)
    assert rows[2][-1] == "FAIL"


def test_demo_comparison_rejects_wrong_rows(demo):
    want = torch.randn(6, 4)
    assert demo.compare(want.clone(), want, 0.0) == (True, "bit-exact")
    off = want.clone()
    off[3, 1] += 1e-3
    assert not demo.compare(off, want, 0.0)[0]
    assert not demo.compare(off, want, 1e-5)[0]
    assert demo.compare(off, want, 1e-2)[0]
    poisoned = want.clone()
    poisoned[0, 0] = float("nan")
    assert not demo.compare(poisoned, want, 1.0)[0]
    assert not demo.compare(want[:5], want, 1.0)[0]


def test_demo_expected_counts_are_worked_out_independently(demo):
    from mm_schedule import MMItem

    def request(*spans):
        r = demo.Request("R", {"input_ids": torch.zeros(1, 100, dtype=torch.long)})
        r.items = [MMItem(modality=m, hash=h, offsets=[(s, e)]) for h, m, s, e in spans]
        return r

    r0 = request((1, "IMAGE", 2, 9), (2, "VIDEO", 30, 39))
    r1 = request((1, "IMAGE", 0, 7), (3, "IMAGE", 10, 19))
    seen: set[int] = set()
    # Window [0, 12) of both: image 1 (shared), image 3 (2 rows); the video is outside.
    assert demo.expected_counts([(r0, 0, 12), (r1, 0, 12)], seen) == (1, 2, 0, 8 + 8 + 2)
    assert demo.expected_counts([(r0, 12, 30), (r1, 12, 10)], seen) == (1, 1, 1, 10 + 8)


def test_vision_encoder_rows_forms_and_bad_pixels():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from vision_encoder import VisionEncoder, small_shape
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from mm_schedule import MMItem

    shape = small_shape(num_layers=1, image_size=28)  # 2 x 2 patches: 4 rows per image
    encoder = VisionEncoder(shape)
    gen = torch.Generator().manual_seed(3)
    image = MMItem(hash=1, offsets=[(0, 3)], feature=encoder.random_image(gen))
    video = MMItem(hash=2, offsets=[(5, 8), (10, 13), (15, 18)], feature=encoder.random_video(3, gen))

    combined = encoder([image, video])
    assert combined.shape == (4 + 12, shape.lm_hidden) and torch.isfinite(combined).all()
    pieces = encoder.encode([image, video], per_item=True)
    assert [p.shape[0] for p in pieces] == [4, 12]
    # Same batch, same arithmetic: the per-item form is the combined rows, split.
    assert torch.equal(torch.cat(pieces), combined)
    # Different images give different rows (the weights are not degenerate).
    assert not torch.allclose(combined[:4], combined[4:8])
    assert encoder.calls == 2 and encoder.items_seen == 4

    with pytest.raises(ValueError, match=r"item 0: feature of shape \(3, 30, 30\)"):
        encoder([MMItem(hash=3, offsets=[(0, 3)], feature=torch.zeros(3, 30, 30))])
    with pytest.raises(TypeError, match="pixel tensor"):
        encoder([MMItem(hash=4, offsets=[(0, 3)], feature=[1, 2, 3])])
