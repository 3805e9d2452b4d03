"""The tuner end to end under the Triton interpreter: it times, writes the lookup format,
and get_config then returns what it timed fastest."""

import json
import os
import subprocess
import sys

import pytest
import torch

from mm_schedule.kernels import tuned_configs
from mm_schedule.kernels.launch_config import heuristic_config
from mm_schedule.kernels.tools import cases
from mm_schedule.kernels.tools import tune as tuner
from mm_schedule.kernels.tools.tune import Shape, main, parse_config_space, parse_shapes, prune
from mm_schedule.kernels.tuned_configs import CONFIG_DIR_ENV, get_config

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="runs the kernels through the Triton interpreter",
)

TINY_SPACE = "BLOCK_M=4,16;BLOCK_H=32,64;num_warps=1;num_stages=1"


@pytest.fixture(autouse=True)
def fresh_lookup(monkeypatch, tmp_path):
    monkeypatch.delenv(CONFIG_DIR_ENV, raising=False)
    monkeypatch.setattr(tuned_configs, "SHIPPED_CONFIG_DIR", tmp_path / "nothing_shipped")
    tuned_configs.clear_cache()
    yield
    tuned_configs.clear_cache()


def fastest(result):
    """The argmin over the returned timing table, computed here rather than trusted."""
    timed = [t for t in result.timings if t.us is not None]
    return min(timed, key=lambda t: t.us).config


def test_tune_then_lookup_returns_the_fastest(tmp_path, monkeypatch):
    out = tmp_path / "tuned"
    timings_file = tmp_path / "all.json"
    argv = [
        "--shapes", "bfloat16:64:16,bfloat16:64:40",
        "--configs", TINY_SPACE,
        "--item-rows", "12",
        "--out", str(out),
        "--timings", str(timings_file),
    ]  # fmt: skip
    report = tuner.run(argv)

    assert report.device == "cpu" and not report.wrong
    assert set(report.files) == {"segment_gather", "placeholder_merge"}
    assert len(report.results) == 4
    for result in report.results:
        # 4 grid configs plus the heuristic, none failing on a correct kernel.
        assert len(result.timings) == 5 and all(
            t.us is not None and t.us > 0 for t in result.timings
        ), result
        assert result.heuristic in [t.config for t in result.timings]

    for kernel, path in report.files.items():
        assert path == out / kernel / "cpu.json"
        doc = json.loads(path.read_text())
        assert doc["kernel"] == kernel and doc["device"] == "cpu" and doc["source"] == "tuned"
        assert doc["triton_version"] == __import__("triton").__version__
        assert doc["command"].startswith("mm-schedule-tune --shapes bfloat16:64:16,bfloat16:64:40")
        assert doc["date"] and "TRITON_INTERPRET=1" in doc["timing"]
        assert set(doc["configs"]["bfloat16"]["64"]) == {"16", "40"}

    monkeypatch.setenv(CONFIG_DIR_ENV, str(out))
    by_shape = {(r.kernel, r.shape.n_rows): r for r in report.results}
    for kernel in ("segment_gather", "placeholder_merge"):
        for rows, bucket in [(16, 16), (40, 40), (8, 16), (30, 40), (5000, 40)]:
            got = get_config(kernel, dtype=torch.bfloat16, hidden=64, n_rows=rows, device="cpu")
            assert got == fastest(by_shape[kernel, bucket]), (kernel, rows)
        # A dtype the tuner did not run: the heuristic.
        got = get_config(kernel, dtype=torch.float16, hidden=64, n_rows=16, device="cpu")
        assert got == heuristic_config(kernel, dtype=torch.float16, hidden=64, n_rows=16)

    # And through the launcher, which resolves its config the same way when given none.
    from mm_schedule.kernels.backend import refresh_backend
    from mm_schedule.kernels.segment_copy.launch import plan_segments

    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", "triton")
    refresh_backend()
    sources = [torch.randn(30, 64).to(torch.bfloat16) for _ in range(2)]
    packed = torch.empty(40, 64, dtype=torch.bfloat16)
    plan = plan_segments(sources, [(0, 0, 20, 0), (1, 5, 20, 20)], packed)
    assert plan.config == fastest(by_shape["segment_gather", 40])

    rows = json.loads(timings_file.read_text())
    assert len(rows) == 20 and sum(r["heuristic"] for r in rows) == 4
    assert all(r["us"] is not None and r["error"] is None for r in rows)


def test_wrong_config_is_reported_and_never_chosen(tmp_path, monkeypatch, capsys):
    class CorruptingGather(cases.GatherCase):
        def launcher(self, buffers, config):
            launch = super().launcher(buffers, config)
            out = buffers[2]

            def corrupted():
                launch()
                if config["BLOCK_M"] == 4:
                    out[-1, -1] = 0.5  # one element of the last row

            return corrupted

    monkeypatch.setitem(cases.CASES, "segment_gather", CorruptingGather)
    out = tmp_path / "tuned"
    argv = [
        "--kernels",
        "segment_gather",
        "--shapes",
        "float32:32:20",
        "--configs",
        TINY_SPACE,
        "--out",
        str(out),
    ]
    assert main(argv) == 1
    assert "wrong result" in capsys.readouterr().err

    tuned_configs.clear_cache()
    report = tuner.run(argv)
    (result,) = report.results
    wrong = [t for t in result.timings if t.error]
    assert wrong and all(
        t.config["BLOCK_M"] == 4 and t.error.startswith("wrong result") for t in wrong
    )
    assert all(t.us is None for t in wrong)
    # Every BLOCK_M 4 config is wrong, so the winner is the fastest of the others (the
    # BLOCK_M 16 configs, or the heuristic, which is BLOCK_M 8 for this shape).
    assert result.best.config["BLOCK_M"] != 4
    assert result.best.config == fastest(result)
    assert result.heuristic["BLOCK_M"] == 8 and result.heuristic_us is not None
    doc = json.loads((out / "segment_gather" / "cpu.json").read_text())
    assert doc["configs"]["float32"]["32"]["20"] == fastest(result)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shapes", "bf16:64:16"], "DTYPE:HIDDEN:ROWS"),
        (["--shapes", "bfloat16:0:16"], "positive"),
        (["--configs", "BLOCK_M=4;BLOCK_H=64;num_warps=1"], "num_stages"),
        (["--configs", "BLOCK_M=3;BLOCK_H=64;num_warps=1;num_stages=1"], "power of two"),
        (["--configs", "BLOCK_Q=3"], "BLOCK_Q"),
        (["--configs", "[{"], "JSON"),
        (["--kernels", "softmax", "--shapes", "bfloat16:64:16"], "softmax"),
        (["--dtypes", "int8"], "int8"),
        (["--rows", "16,x"], "--rows"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv, message, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mm-schedule-tune: error:") and message in err
    assert not any(tmp_path.iterdir()), "nothing may be written on bad input"


def test_refuses_to_run_without_gpu_or_interpreter(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tuner, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--shapes", "bfloat16:64:16", "--quick", "--out", str(tmp_path)]) == 2
    assert "no CUDA or ROCm GPU" in capsys.readouterr().err


def test_config_space_parsing_and_pruning():
    grid = parse_config_space(TINY_SPACE)
    assert len(grid) == 4 and {c["BLOCK_M"] for c in grid} == {4, 16}
    listed = parse_config_space('[{"BLOCK_M": 2, "BLOCK_H": 128, "num_warps": 4, "num_stages": 2}]')
    assert listed == [{"BLOCK_M": 2, "BLOCK_H": 128, "num_warps": 4, "num_stages": 2}]
    assert parse_shapes("float16:4096:1024, float32:64:1") == [
        Shape("float16", 4096, 1024),
        Shape("float32", 64, 1),
    ]

    space = tuner.grid(tuner.FULL_SPACE)
    kept = prune(space, Shape("bfloat16", 1152, 64), itemsize=2, warp_size=32)
    assert kept and len(kept) < len(space)
    for cfg in kept:
        assert cfg["BLOCK_H"] <= 2048 and cfg["BLOCK_M"] <= 64
        per_thread = cfg["BLOCK_M"] * cfg["BLOCK_H"] * 2 / (cfg["num_warps"] * 32)
        assert 16 <= per_thread <= 256
    dropped = [c for c in space if c not in kept]
    assert any(c["BLOCK_H"] == 4096 for c in dropped)
    # Wave64 halves the elements per thread, so some tiles become too small to keep.
    assert len(prune(space, Shape("bfloat16", 4096, 4096), 2, 64)) != len(
        prune(space, Shape("bfloat16", 4096, 4096), 2, 32)
    )


def test_every_kernel_has_a_tuning_case():
    from mm_schedule.kernels.registry import KERNELS

    for entry in KERNELS.values():
        assert issubclass(cases.CASES[entry.name], cases.Case), entry.name


def test_module_entry_point_help():
    done = subprocess.run(
        [sys.executable, "-m", "mm_schedule.kernels.tools.tune", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--configs" in done.stdout and "MM_SCHEDULE_KERNEL_CONFIG_DIR" in done.stdout
