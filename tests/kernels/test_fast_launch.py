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


class _Compiled:
    """A compiled kernel as Triton keeps one: specialised on what it saw at its JIT launch."""

    packed_metadata = function = None

    def __init__(self, spec, log):
        self.spec, self.log = spec, log

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, gx, gy, gz, stream, function, packed, metadata, enter, leave, *args):
        self.log.append(("direct", self.spec, _specialisation(args)))


def _specialisation(args):
    """What Triton derives from argument values here: 16-byte alignment of each pointer
    (``tt.divisibility``), and the integer width of the (unspecialised) integers."""
    pointers = tuple(None if a is None else a.data_ptr() % 16 == 0 for a in args[:2])
    return pointers, tuple(a > 0x7FFFFFFF for a in args[2:6] if isinstance(a, int))


class _FakeJit:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        def run(*args, **kw):
            spec = _specialisation(args)
            self.log.append(("jit", spec, spec))
            return _Compiled(spec, self.log)

        return run


@pytest.mark.parametrize("one_segment", [False, True])
def test_a_cached_handle_runs_only_arguments_of_the_alignment_it_was_compiled_for(one_segment):
    """A handle compiled for a 16-byte aligned destination (or table) assumes it: reused
    for a misaligned one, the GPU would fault or write the wrong bytes. Each launch must
    run on a handle compiled for its own pointers' alignment."""
    import torch

    from mm_schedule.kernels.segment_copy import launch as gather_mod

    log = []
    config = {"BLOCK_M": 4, "BLOCK_H": 64, "num_warps": 1, "num_stages": 1}
    launch = gather_mod._make_launch(torch.float16, 64, 1, one_segment, config)  # VEC=1: any alignment
    launch.spec.jit_fn = _FakeJit(log)
    rows = torch.empty(2 * 64 * 8 + 8, dtype=torch.float16)
    words = torch.zeros(64, dtype=torch.int64)
    aligned_dest = rows[: 64 * 8].view(8, 64)
    shifted_dest = rows[1 : 1 + 64 * 8].view(8, 64)  # 2 bytes past a 16-byte boundary
    aligned_table, shifted_table = words[:32], words[1:33]  # 8 bytes past
    assert aligned_dest.data_ptr() % 16 == 0 == aligned_table.data_ptr() % 16
    assert shifted_dest.data_ptr() % 16 and shifted_table.data_ptr() % 16
    if one_segment:
        calls = [(dest, None, (0x1000 + 16 * i, 0, 8)) for dest in (aligned_dest, shifted_dest) for i in range(2)]
        calls += [(aligned_dest, None, (0x1_0000_0000, 0, 8))]  # a 64-bit address: another handle
    else:
        calls = [(dest, table, None) for dest in (aligned_dest, shifted_dest)
                 for table in (aligned_table, shifted_table) for _ in range(2)]  # fmt: skip
    for dest, table, one in calls:
        gather_mod._launch(launch, dest, 2, table, one, stream=0)
    compiled_for = {spec for kind, spec, _ in log if kind == "jit"}
    assert len(compiled_for) == (3 if one_segment else 4)  # one compile per specialisation
    direct = [(spec, seen) for kind, spec, seen in log if kind == "direct"]
    assert len(direct) == len(calls) - len(compiled_for)
    assert all(spec == seen for spec, seen in direct), direct


ORDER_SCRIPT = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("bench_kernel_host", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_kernel_host"] = bench
spec.loader.exec_module(bench)
from triton.runtime import driver
from mm_schedule.kernels import backend
from mm_schedule.kernels.segment_copy import launch as gather
from mm_schedule.kernels.segment_copy.staging import StagingRing

order = []

class Recording(bench._StubLauncher):
    def __call__(self, *args):
        order.append("launch")

class Event:
    def record(self):
        order.append("slot event")
    def query(self):
        return True
    def synchronize(self):
        order.append("slot wait")

stub = bench.StubDriver()
stub.launcher_cls = Recording
driver.set_active(stub)
backend.set_backend("triton")
stand_in = bench.GpuStandIn()
stand_in.ring = StagingRing(stand_in.ring._host_empty, stand_in.ring._device_empty, Event)
gather.layer = lambda device: stand_in
real_stage = gather.build_table
gather.build_table = lambda *a: order.append("stage") or real_stage(*a)
sources, segments, dest = bench.images(3)
for _ in range(3):  # the JIT's launch, then direct launches of the cached handle
    gather.launch_segments(sources, segments, dest)
print(json.dumps(order))
"""


def test_the_staging_event_follows_the_driver_launch_on_every_path():
    """With the GPU driver stubbed (Triton compiles for sm_90, its launcher records the
    call), the slot's event is recorded after the driver launch, on the JIT's first launch
    and on the direct launches after it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-c", ORDER_SCRIPT, str(BENCH)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    order = json.loads(proc.stdout.strip().splitlines()[-1])
    assert order == ["stage", "launch", "slot event"] * 3
