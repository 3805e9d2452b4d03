"""The merge benchmark runs end to end, checks every path before timing it, and its
peer re-implementations behave like the releases they mirror."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "bench_merge.py"
PEER_PATHS = {
    "gather": {"ours", "ours-planned", "torch.cat", "copy-loop"},
    "merge": {"ours", "ours-planned", "ours-by-ids", "masked_scatter", "index_put", "index_put-cpu", "index_copy", "hf",
              "copy-loop"},
}


def load_bench():
    """Import benchmarks/bench_merge.py (a script folder, not a package) by path."""
    if "bench_merge" in sys.modules:
        return sys.modules["bench_merge"]
    spec = importlib.util.spec_from_file_location("bench_merge", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_merge"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One CPU smoke run with our kernel in the Triton interpreter (a real kernel, not the
    torch fallback)."""
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, TRITON_INTERPRET="1", MM_SCHEDULE_KERNEL_BACKEND="triton", PYTHONUNBUFFERED="1")
    env.pop("MM_SCHEDULE_KERNEL_CONFIG_DIR", None)
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--cpu-smoke", "--out-dir", str(out), "--repeats", "1", "--sweep", "3",
         "--no-plot"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "kernels_cpu-smoke.json").read_text()), (out / "kernels_cpu-smoke.md").read_text()


def test_every_path_ran_bit_exact_on_every_case(smoke_run):
    _, result, _ = smoke_run
    records = result["records"]
    bench = load_bench()
    for case in bench.CPU_SMOKE_CASES:
        for op, wanted in PEER_PATHS.items():
            got = {r["path"] for r in records if r["case"] == case.name and r["op"] == op}
            assert got == wanted, (case.name, op, got)
    for r in records:
        assert r["bit_exact"] is True, r
        assert r["time_us"] > 0 and r["wall_us"] > 0, r
    assert "triton" in result["environment"]["kernel_backend"]
    ran = " ".join(result["notes"])
    assert "backend=triton" in ran, result["notes"]


def test_markdown_has_a_row_per_path_and_the_run_header(smoke_run):
    _, result, md = smoke_run
    for field in ("date", "command", "torch / triton / python", "device"):
        assert f"| {field} |" in md
    assert "--cpu-smoke" in result["environment"]["command"]
    rows = [line for line in md.splitlines() if line.startswith("| smoke-")]
    table_rows = [line for line in rows if line.count("|") > 10]
    assert len(table_rows) == len(result["records"])
    for line in table_rows:
        assert line.rstrip().endswith("| yes |"), line


def test_sweep_checked_our_entry_points(smoke_run):
    _, result, _ = smoke_run
    assert result["sweep"]["failures"] == []
    checks = int(result["sweep"]["summary"].split()[0])
    assert checks >= 3 * 2


def _smoke_problem(bench):
    case = bench.CPU_SMOKE_CASES[1]
    return bench.build_problem(case, torch.device("cpu"), seed=3, n_sets=2)


def _settings(bench):
    return bench.Settings(device=torch.device("cpu"), repeats=1, wall_calls=1, graph_replays=1, timer=None,
                          budget=bench.Budget())


@pytest.mark.parametrize("fault", ["drop-last-segment", "shift-one-row", "leave-packed-unwritten"])
def test_a_wrong_path_is_reported_and_not_timed(fault):
    bench = load_bench()
    p = _smoke_problem(bench)

    def prepare(p, b):
        def run():
            table = p.gather_table
            if fault == "drop-last-segment":
                table = table[:-1]
            if fault == "shift-one-row":
                s, r, n, d = table[0]
                table = [(s, r + 1, n - 1, d), *table[1:]]
            if fault != "leave-packed-unwritten":
                for s, r, n, d in table:
                    b.packed[d : d + n].copy_(b.sources[s][r : r + n])
            return b.packed

        return run

    spec = bench.PathSpec("broken", "gather", "a deliberately wrong path", prepare)
    record = bench.measure(p, spec, _settings(bench))
    assert record["bit_exact"] is False
    assert "time_us" not in record and "differs" in record["error"]


def test_a_right_path_passes_the_same_check():
    bench = load_bench()
    p = _smoke_problem(bench)
    spec = bench.PathSpec("loop", "merge", "copy loop", lambda p, b: lambda: bench.peers.copy_loop(
        b.embeds, b.sources, p.merge_table))
    record = bench.measure(p, spec, _settings(bench))
    assert record["bit_exact"] is True and record["time_us"] > 0


def _random_merge(seed, tokens=40, hidden=8, rows=None):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(tokens, generator=gen) < 0.4
    n = int(mask.sum()) if rows is None else rows
    embeds = torch.randn(tokens, hidden, generator=gen)
    src = torch.randn(n, hidden, generator=gen)
    return embeds, src, mask


@pytest.mark.parametrize("seed", range(5))
def test_peer_merges_agree_with_each_other(seed):
    peers = load_bench().peers
    embeds, src, mask = _random_merge(seed)
    views = [src[: len(src) // 2], src[len(src) // 2 :]]
    expected = embeds.clone()
    expected[mask.nonzero().squeeze(1)] = src
    results = {
        "masked_scatter": peers.masked_scatter_merge(embeds.clone(), views, mask),
        "index_put": peers.index_put_merge(embeds.clone(), views, mask),
        "index_put_host": peers.index_put_host_mask_merge(embeds.clone(), views, mask),
        "cumsum_index_copy": peers.cumsum_index_copy_merge(embeds.clone(), views, mask),
        "hf": peers.hf_merge(embeds.clone(), views, mask),
    }
    for name, got in results.items():
        assert torch.equal(got, expected), name


def test_cumsum_index_copy_keeps_sglangs_count_behaviour():
    """As recorded for SGLang 0.5.19: surplus rows fail, exactly one row short passes
    silently (the last placeholder keeps its text embedding), two short fail."""
    peers = load_bench().peers
    embeds, src, mask = _random_merge(7)
    n = int(mask.sum())
    with pytest.raises((IndexError, RuntimeError)):
        peers.cumsum_index_copy_merge(embeds.clone(), [torch.cat([src, src[:1]])], mask)
    short = peers.cumsum_index_copy_merge(embeds.clone(), [src[: n - 1]], mask)
    last = mask.nonzero()[-1].item()
    assert torch.equal(short[last], embeds[last])
    with pytest.raises((IndexError, RuntimeError)):
        peers.cumsum_index_copy_merge(embeds.clone(), [src[: n - 2]], mask)


def test_index_put_peer_raises_on_a_count_mismatch():
    peers = load_bench().peers
    embeds, src, mask = _random_merge(9)
    with pytest.raises(ValueError, match="placeholders"):
        peers.index_put_merge(embeds.clone(), [src[:-1]], mask)


@pytest.mark.gpu
def test_sync_counter_and_zero_syncs_of_ours_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm device")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("the kernels must be compiled for the GPU: run with TRITON_INTERPRET=0")
    bench = load_bench()
    common = bench.C
    device = torch.device("cuda")
    x = torch.ones(4, device=device)
    assert common.count_host_syncs(lambda: x.sum().item(), device) >= 1
    assert common.count_host_syncs(lambda: x.add_(1), device) == 0
    case = next(c for c in bench.GPU_CASES if c.name == "llava1.5-1img")
    p = bench.build_problem(case, device, seed=0, n_sets=2)
    settings = bench.Settings(device=device, repeats=3, wall_calls=3, graph_replays=1, timer=bench.GpuTimer(device),
                              budget=bench.Budget())
    for spec in bench.all_paths():
        if spec.ours:
            record = bench.measure(p, spec, settings)
            assert record["bit_exact"], record
            assert record["host_syncs"] == 0, record
    assert {info["backend"] for info in p.plan_info.values()} == {"triton"}, p.plan_info


def _report_with(bench, planned_us, planned_wall_us):
    """A GPU report with made-up numbers: the API call and the by-ids path are slow (the
    per-call planning, the extra torch.cat), the planned launch is as given."""
    from _merge_report import RunReport

    report = RunReport(env={"device": "test"}, gpu=True, empty_launch={"wall_us": 5.0, "device_us": 2.0})
    report.cases = [c for c in bench.GPU_CASES if c.name in ("qwen2.5vl7b-chunk8192", "llava1.5-1img")]
    for case in report.cases:
        report.copy_same_bytes_us[case.name] = case.ideal_bytes / 4.3e6  # as fast as a 4.3 TB/s copy
        for op in ("gather", "merge"):
            ideal_us = report.copy_same_bytes_us[case.name]
            for path, us, wall in (("ours", 3 * ideal_us, 150.0), ("ours-by-ids", 2.5 * ideal_us, 60.0),
                                   ("ours-planned", planned_us(ideal_us), planned_wall_us),
                                   ("masked_scatter", 3 * ideal_us, 90.0)):
                report.records.append({"case": case.name, "op": op, "path": path, "ours": path.startswith("ours"),
                                       "time_us": us, "wall_us": wall, "host_syncs": 0, "bit_exact": True})
    report.attach_ratios()
    return report


def test_targets_judge_the_planned_launch_not_the_api_call():
    bench = load_bench()
    met = _report_with(bench, planned_us=lambda ideal: ideal / 0.9, planned_wall_us=6.0).targets()
    assert [verdict for *_, verdict in met] == ["met"] * 4, met
    missed = _report_with(bench, planned_us=lambda ideal: ideal / 0.8, planned_wall_us=9.0).targets()
    bandwidth, speedup, latency, syncs = (verdict for *_, verdict in missed)
    assert (bandwidth, speedup, latency, syncs) == ("NOT met", "met", "NOT met", "met"), missed
    assert "80.0%" in missed[0][1] and "1.80×" in missed[2][1]
