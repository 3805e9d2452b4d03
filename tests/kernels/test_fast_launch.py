"""Direct launches of cached compiled kernels pass exactly what Triton's JIT passes.

Runs in a subprocess with the compiled (not interpreted) Triton and the benchmark's stub
driver, whose launcher records every call instead of reaching a GPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernel_host.py"

SCRIPT = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("bench_kernel_host", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
import torch
from triton.runtime import driver

calls = []

class Recording(bench._StubLauncher):
    def __call__(self, *args):
        grid, stream, metadata, enter = args[:3], args[3], args[6], args[7]
        if enter is not None and metadata is not None:
            enter(metadata)  # what Triton's C launcher does before launching
        rest = [a.data_ptr() if isinstance(a, torch.Tensor) else repr(a) for a in args[9:]]
        calls.append([list(grid), stream, rest])

stub = bench.StubDriver()
stub.launcher_cls = Recording
driver.set_active(stub)
from mm_schedule.kernels import backend
from mm_schedule.kernels.segment_copy import launch as gather
backend.set_backend("triton")
jit_runs = []
real_run = gather.segment_copy_kernel.run
gather.segment_copy_kernel.run = lambda *a, **k: jit_runs.append(1) or real_run(*a, **k)

sources, segments, dest = bench.images(3)
for table in (segments, segments[:1]):
    for _ in range(3):
        gather.launch_segments(sources, table, dest)
# A launch hook sees direct launches too.
from triton import knobs
seen = []
hook = lambda metadata: seen.append(metadata.get()["name"])
knobs.runtime.launch_enter_hook.add(hook)
gather.launch_segments(sources, segments, dest)
knobs.runtime.launch_enter_hook.remove(hook)
print(json.dumps({"calls": calls, "jit_runs": len(jit_runs), "hooked": seen}))
"""


def test_direct_launches_repeat_the_jit_launch_exactly():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(BENCH)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    calls = result["calls"]
    assert len(calls) == 7
    assert result["jit_runs"] == 2  # one JIT launch per launch shape, then direct launches
    assert result["hooked"] == ["segment_copy_kernel"]
    table_calls, one_calls = calls[:3], calls[3:6]
    # Same grid, stream and arguments each time (the table itself is a new tensor per call).
    for group, skip in ((table_calls, 0), (one_calls, None)):
        first = group[0]
        for later in group[1:]:
            assert later[:2] == first[:2]
            assert [a for i, a in enumerate(later[2]) if i != skip] == [
                a for i, a in enumerate(first[2]) if i != skip
            ]
    assert one_calls[0][2][0] == "None" and one_calls[0][2][3] != "0"  # no table, an address
