"""The GPU check script, run whole on the CPU (interpreter, tiny sizes), and its time caps."""

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from mm_schedule.kernels import tuned_configs
from mm_schedule.kernels.launch_config import heuristic_config
from mm_schedule.kernels.tools import bandwidth, cases, tune
from mm_schedule.kernels.tools.space import Shape, parse_config_space
from mm_schedule.kernels.tools.timing import Budget

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="runs the kernels through the Triton interpreter",
)

REPO = Path(__file__).resolve().parents[2]
TINY = parse_config_space("BLOCK_M=4;BLOCK_H=64;num_warps=1;num_stages=1")


def unpack(out: Path, into: Path) -> Path:
    """The run's one archive, unpacked; returns its folder."""
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = tar.getnames()
        assert all(n == "gpu_check" or n.startswith("gpu_check/") for n in names), names
        tar.extractall(into, filter="data")
    return into / "gpu_check"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu_check")
    out, installed = base / "out", base / "installed"
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("MM_SCHEDULE_KERNEL_BACKEND", None)
    done = subprocess.run(
        [sys.executable, "-m", "mm_schedule.kernels.tools.gpu_check", "--dry-run", "--out", str(out),
         "--configs-dir", str(installed)],
        cwd=base, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return out, installed, done, base


def test_dry_run_runs_every_step_and_leaves_one_archive_of_everything(dry_run):
    out, installed, done, base = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz"]  # one file, nothing loose
    files = unpack(out, base / "unpacked")
    found = sorted(str(p.relative_to(files)) for p in files.rglob("*") if p.is_file())
    assert found == sorted([
        "summary.json", "gpu_check.log", "tests.log", "aot_report.json", "aot_sm90.log",
        "bandwidth.json", "bandwidth.md", "tuned/segment_gather/cpu.json",
        "kernels_cpu-smoke.json", "kernels_cpu-smoke.md",
    ])  # fmt: skip
    summary = json.loads((files / "summary.json").read_text())
    assert [(s["name"], s["status"]) for s in summary["steps"]] == [
        ("tests", "ok"), ("tune", "ok"), ("bandwidth", "ok"), ("bench", "ok"), ("aot", "ok"),
    ]  # fmt: skip
    assert summary["exit_status"] == 0 and summary["environment"]["torch"] == torch.__version__
    # The tuner's file is in the format the lookup reads ...
    table = tuned_configs.load_table(files / "tuned" / "segment_gather" / "cpu.json")
    heuristic = heuristic_config("segment_gather", dtype=torch.bfloat16, hidden=64, n_rows=16)
    assert table.configs["bfloat16"][64][16] in (TINY[0], heuristic)
    assert summary["tuner"] and "best" in summary["tuner"][0]["msg"]
    # ... and installed where --configs-dir says, only there.
    assert (installed / "segment_gather" / "cpu.json").read_bytes() == (
        files / "tuned" / "segment_gather" / "cpu.json").read_bytes()  # fmt: skip
    # The AOT report compiled real code (the dry run's two compiles, sm_90) with 16-byte access.
    aot = json.loads((files / "aot_report.json").read_text())
    assert aot["targets"] == ["sm90"] and aot["compiles"] == 2 == len(aot["reports"])
    assert all(r["vector_load"] and r["vector_store"] and r["target"] == "sm90" for r in aot["reports"])
    # The sweep checked every case bit for bit (interpreted, tiny) and reported its launch.
    sweep = json.loads((files / "bandwidth.json").read_text())
    assert [r["name"] for r in sweep["records"]] == [c.name for c in bandwidth.CASES]
    assert all(r["bit_exact"] and r["programs"] >= r["tiles_with_work"] > 0 for r in sweep["records"])
    assert "| 4096 segments x 16 rows |" in (files / "bandwidth.md").read_text()
    # The benchmark ran our Triton kernel (interpreted), bit-exact on every path.
    bench = json.loads((files / "kernels_cpu-smoke.json").read_text())
    assert bench["records"] and all(r["bit_exact"] for r in bench["records"])
    assert any("backend=triton" in note for note in bench["notes"]), bench["notes"]
    log = (files / "gpu_check.log").read_text()
    for line in ("== tests", "== tune", "== bandwidth", "== bench", "== aot", "gpu_check summary", "-m gpu"):
        assert line in log
    assert "deselected" in (files / "tests.log").read_text()  # pytest -m gpu chose the GPU tests


def test_a_run_out_of_time_says_so_and_fails(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-m", "mm_schedule.kernels.tools.gpu_check", "--dry-run", "--out", str(tmp_path),
         "--budget-s", "6", "--skip", "tests,aot", "--keep-files"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:]
    steps = json.loads((tmp_path / "gpu_check" / "summary.json").read_text())["steps"]
    assert [s["name"] for s in steps] == ["tests", "tune", "bandwidth", "bench", "aot"]
    assert steps[0]["status"] == steps[4]["status"] == "skipped"
    assert {s["status"] for s in steps[1:4]} == {"timed out"}
    # --keep-files: the folder stays beside its archive, which holds the same summary.
    assert unpack(tmp_path, tmp_path / "unpacked").joinpath("summary.json").read_text() == (
        tmp_path / "gpu_check" / "summary.json").read_text()  # fmt: skip


def test_no_gpu_without_dry_run_exits_2(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "-m", "mm_schedule.kernels.tools.gpu_check", "--out", str(tmp_path / "out"),
         "--results-dir", str(tmp_path / "results")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "no GPU" in done.stdout
    # Nothing was measured, so nothing is copied beside the results; the archive says why.
    assert not (tmp_path / "results").exists()
    files = unpack(tmp_path / "out", tmp_path / "unpacked")
    assert json.loads((files / "summary.json").read_text())["exit_status"] == 2
    assert "no GPU" in (files / "gpu_check.log").read_text()


class _CapAfter(Budget):
    """Exceeded once ``limit`` checks have been made: a time cap without timing anything."""

    def __init__(self, limit):
        super().__init__()
        self.checks, self.limit = 0, limit

    def exceeded(self):
        self.checks += 1
        return self.checks > self.limit


@pytest.fixture
def no_shipped(monkeypatch, tmp_path):
    monkeypatch.setattr(tuned_configs, "SHIPPED_CONFIG_DIR", tmp_path / "nothing_shipped")
    tuned_configs.clear_cache()
    yield
    tuned_configs.clear_cache()


def test_tuner_writes_after_every_shape(tmp_path, monkeypatch, no_shipped):
    class DiesOnSecondShape(cases.GatherCase):
        def __init__(self, shape, *rest, **kw):
            if shape.n_rows == 20:
                raise KeyboardInterrupt("killed during the second shape")
            super().__init__(shape, *rest, **kw)

    monkeypatch.setitem(cases.CASES, "segment_gather", DiesOnSecondShape)
    timings = tmp_path / "timings.json"
    with pytest.raises(KeyboardInterrupt):
        tune.tune(["segment_gather"], [Shape("float32", 32, 12), Shape("float32", 32, 20)],
                  configs=TINY, out=tmp_path, item_rows=8, reps=1, timings_path=timings)  # fmt: skip
    doc = json.loads((tmp_path / "segment_gather" / "cpu.json").read_text())
    assert list(doc["configs"]["float32"]["32"]) == ["12"]
    assert {row["n_rows"] for row in json.loads(timings.read_text())} == {12}


def test_tuner_stops_between_configs_and_keeps_what_it_timed(tmp_path, no_shipped):
    shapes = [Shape("float32", 32, 12), Shape("float32", 32, 20)]
    space = parse_config_space("BLOCK_M=4,16;BLOCK_H=32,64;num_warps=1;num_stages=1")
    # 5 candidates: 5 checks before the compile phase of shape 1, then 5 before timing;
    # the budget runs out after the first two configs are timed.
    budget = _CapAfter(1 + 5 + 2)
    report = tune.tune(["segment_gather"], shapes, configs=space, out=tmp_path, item_rows=8, reps=1,
                       budget=budget)  # fmt: skip
    (result,) = report.results
    timed = [t for t in result.timings if t.us is not None]
    assert len(timed) == 2
    assert all(t.error == tune.SKIPPED for t in result.timings if t.us is None)
    assert report.not_reached == [("segment_gather", shapes[1])]
    doc = json.loads((tmp_path / "segment_gather" / "cpu.json").read_text())
    assert doc["configs"]["float32"]["32"]["12"] == min(timed, key=lambda t: t.us).config


def test_compiles_are_not_charged_to_the_cap():
    budget = Budget(timed_s=0.05)
    with budget.untimed():
        time.sleep(0.2)
    assert not budget.exceeded()
    time.sleep(0.06)
    assert budget.exceeded()
    assert Budget(hard_deadline=time.monotonic() - 1).exceeded()


def test_wrapper_runs_from_anywhere_with_a_relative_out(tmp_path):
    """What runs on the GPU machine: the shell wrapper, nothing installed, any cwd."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out", "rel",
         "--skip", "tests,bench,bandwidth,aot"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    files = unpack(tmp_path / "rel", tmp_path / "unpacked")
    summary = json.loads((files / "summary.json").read_text())
    assert summary["environment"]["repository"] == str(REPO)
    assert (files / "tuned" / "segment_gather" / "cpu.json").is_file()


def test_every_module_needing_an_optional_package_is_left_out_without_it():
    """The GPU machine may lack a test-only package: a module importing one is listed in
    the conftest, so that it is left out of collection instead of stopping the GPU tests."""
    import re
    from pathlib import Path

    from tests.kernels import conftest

    folder = Path(conftest.__file__).parent
    for name, listed in conftest.OPTIONAL_IMPORTS.items():
        pattern = re.compile(rf"^\s*(?:from|import)\s+{name}\b", re.M)
        importing = sorted(p.name for p in folder.glob("test_*.py") if pattern.search(p.read_text()))
        assert importing == sorted(listed), name


def test_a_gpu_run_writes_outside_out_only_where_asked(tmp_path, monkeypatch):
    from mm_schedule.kernels.tools import gpu_check

    configs, results = tmp_path / "configs", tmp_path / "results"
    out = tmp_path / "out" / "gpu_check"
    (out / "tuned" / "segment_gather").mkdir(parents=True)
    (out / "tuned" / "segment_gather" / "NVIDIA_H200.json").write_text("{}")
    (out / "gpu_check.log").write_text("log")
    (out / "bandwidth.md").write_text("sweep")
    def committed():
        folders = (REPO / "benchmarks" / "results", REPO / "kernels" / "configs")
        return sorted((p, p.stat().st_mtime_ns) for folder in folders for p in folder.rglob("*"))

    before = committed()
    gpu_check._publish(gpu_check.parse_args(["--out", str(tmp_path / "out")]), out, {"gpu": "NVIDIA H200"})
    assert committed() == before  # by default nothing is written beside the checkout's files
    args = gpu_check.parse_args(["--out", str(tmp_path / "out"), "--results-dir", str(results),
                                 "--configs-dir", str(configs)])  # fmt: skip
    gpu_check._publish(args, out, {"gpu": None})  # no GPU: nothing measured, nothing copied
    assert not configs.exists() and not results.exists()
    gpu_check._publish(args, out, {"gpu": "NVIDIA H200"})
    assert (configs / "segment_gather" / "NVIDIA_H200.json").read_text() == "{}"
    assert (results / "tuned" / "segment_gather" / "NVIDIA_H200.json").is_file()
    assert (results / "bandwidth.md").read_text() == "sweep"
    assert gpu_check.write_archive(out) == tmp_path / "out" / "gpu_check.tar.gz"
    assert sorted(p.relative_to(tmp_path / "unpacked").as_posix() for p in unpack(
        tmp_path / "out", tmp_path / "unpacked").rglob("*") if p.is_file()) == [
        "gpu_check/bandwidth.md", "gpu_check/gpu_check.log", "gpu_check/tuned/segment_gather/NVIDIA_H200.json",
    ]  # fmt: skip


def test_what_only_a_gpu_run_uses_is_valid_and_fits_eight_minutes():
    """The GPU run's own settings, which the dry run replaces by tiny ones: the tuner's
    shapes parse, the AOT targets exist, every sweep case's segments fit its destination
    without overlapping, and the default caps leave the budget inside the documented
    `timeout 480` with half a minute for start-up."""
    from mm_schedule.kernels.tools import aot, gpu_check
    from mm_schedule.kernels.tools.space import parse_shapes

    shapes = parse_shapes(",".join(gpu_check.TUNE_SHAPES.format(h=h) for h in gpu_check.TUNE_HIDDEN))
    assert len(shapes) == 2 * len(gpu_check.TUNE_HIDDEN)
    assert set(gpu_check.AOT_TARGETS) == set(aot.TARGETS)
    for case in bandwidth.CASES:
        assert case.dtype in ("bfloat16", "float16", "float32") and case.hidden % 8 == 0
        gap = (case.dest_rows - sum(case.segment_rows)) // len(case.segment_rows)
        assert gap >= 0, case.name
        last = sum(case.segment_rows) + gap * (len(case.segment_rows) - 1)
        assert last <= case.dest_rows, case.name
        small = bandwidth.tiny(case)
        assert sum(small.segment_rows) <= small.dest_rows and small.hidden == 64
    args = gpu_check.parse_args(["--out", "x"])
    assert args.budget_s + 30 <= 480
    assert args.tests_s + 2 * args.tune_s + args.bandwidth_s < args.budget_s  # the benchmark gets the rest
    assert args.aot_s < args.budget_s  # compiled beside the other steps, from the start
