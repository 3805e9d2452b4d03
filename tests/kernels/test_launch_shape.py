"""The shape of segment-copy launches: tiles and grid follow the rows a table copies.

Runs in a subprocess with the compiled (not interpreted) Triton and the host benchmark's
stub driver, which compiles for sm_90 and records every launch instead of reaching a GPU:
the grid below is the one Triton hands the driver. Tensors are ``torch.empty`` (nothing
is copied, so nothing is ever written to them).

What must hold, for one image, a few images merged into a long prompt and thousands of
small segments: no more programs than 1.1 x the tiles that hold rows, and at least 256
programs with rows whenever 512 rows or more are copied (an H200 has 132 SMs), whatever
the destination's length.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mm_schedule.kernels.launch_config import heuristic_config, row_bucket

pytest.importorskip("triton")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernel_host.py"
HIDDEN = 3584


def _spread(counts, gap):
    """Segments of ``counts`` rows from one source each, ``gap`` text rows before each."""
    segments, row = [], gap
    for i, n in enumerate(counts):
        segments.append([i, 0, n, row])
        row += n + gap
    return segments, row


def _scenarios():
    one_image = [[0, 0, 1024, 0]]
    two_small, _ = _spread([256, 256], 100)
    two_large, _ = _spread([1024, 1024], 1000)
    many, many_rows = _spread([16] * 4096, 0)
    return {
        "one image": (one_image, 1024, "trusted"),
        "one image into a long prompt": ([[0, 0, 700, 5000]], 32768, "merge"),
        "2 x 256 rows into 32,768 tokens": (two_small, 32768, "merge"),
        "2 x 1,024 rows into 8,192 tokens": (two_large, 8192, "trusted"),
        "4,096 x 16 rows": (many, many_rows, "trusted"),
        "3 x 10 rows into 4,096 tokens": (_spread([10] * 3, 7)[0], 4096, "merge"),
    }


SCRIPT = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("bench_kernel_host", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
import torch
from triton.runtime import driver

launches = []

class Recording(bench._StubLauncher):
    def __call__(self, *args):
        launches[-1]["grid"] = list(args[:3])

stub = bench.StubDriver()
stub.launcher_cls = Recording
driver.set_active(stub)
from mm_schedule.kernels import backend
from mm_schedule.kernels.segment_copy import launch as gather
from mm_schedule.kernels.segment_copy.fast_launch import LaunchSpec
backend.set_backend("triton")
real = LaunchSpec.launch

def launch(self, grid, args, variant, stream):
    table = args[0]
    launches.append({"block_m": self.constexprs["BLOCK_M"],
                     "table": None if table is None else table.tolist()})
    return real(self, grid, args, variant, stream)

LaunchSpec.launch = launch
scenarios, hidden = json.loads(sys.argv[2]), int(sys.argv[3])
shapes = {}
for name, (segments, dest_rows, way) in scenarios.items():
    sources = [torch.empty(s[1] + s[2], hidden, dtype=torch.bfloat16) for s in segments]
    dest = torch.empty(dest_rows, hidden, dtype=torch.bfloat16)
    for _ in range(2):  # the JIT launch, then the direct one
        if way == "merge":  # merge_segments's launch, after its checks
            gather.launch_segments(sources, [tuple(s) for s in segments], dest)
        else:
            gather.launch_trusted(sources, [tuple(s) for s in segments], dest)
    shapes[name] = launches[-2:]
print(json.dumps(shapes))
"""


@pytest.fixture(scope="module")
def shapes():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(BENCH), json.dumps(_scenarios()), str(HIDDEN)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(_scenarios()))
def test_programs_follow_the_rows_the_table_copies(shapes, name):
    segments, dest_rows, _ = _scenarios()[name]
    rows = sum(s[2] for s in segments)
    for launch in shapes[name]:
        (programs, y, z), block_m = launch["grid"], launch["block_m"]
        assert (y, z) == (1, 1)
        with_rows = sum(-(-s[2] // block_m) for s in segments)
        assert with_rows <= programs <= 1.1 * with_rows, (programs, with_rows, block_m)
        if rows >= 512:
            assert with_rows >= 256, (with_rows, block_m)
        # The tile height is the one for the copied rows, never the destination's.
        expected = heuristic_config("segment_gather", dtype=torch.bfloat16, hidden=HIDDEN,
                                    n_rows=row_bucket(rows))["BLOCK_M"]  # fmt: skip
        assert block_m == expected, (block_m, expected, dest_rows)
        if launch["table"] is not None:
            # The packed cumulative tile counts end at the grid: every program has a tile.
            n = launch["table"][0]
            ends = launch["table"][1 : 1 + n]
            assert ends == [sum(-(-s[2] // block_m) for s in segments[: i + 1]) for i in range(n)]
            assert ends[-1] == programs


def test_the_long_destinations_would_have_starved_the_gpu(shapes):
    """Guards the scenarios: tiles sized for the destination's rows leave too few programs."""
    for name in ("2 x 256 rows into 32,768 tokens", "2 x 1,024 rows into 8,192 tokens"):
        segments, dest_rows, _ = _scenarios()[name]
        block_m = heuristic_config("segment_gather", dtype=torch.bfloat16, hidden=HIDDEN,
                                   n_rows=row_bucket(dest_rows))["BLOCK_M"]  # fmt: skip
        assert sum(-(-s[2] // block_m) for s in segments) < 256
        assert shapes[name][0]["block_m"] < block_m
