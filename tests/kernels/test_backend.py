"""Backend selection, launch configs and import hygiene."""

import subprocess
import sys

import pytest
import torch

from mm_schedule.errors import KernelInputError
from mm_schedule.kernels.backend import refresh_backend, select_backend, set_backend, uses_triton
from mm_schedule.kernels.launch_config import heuristic_config, unaligned_config, validate_config
from mm_schedule.kernels.segment_copy import launch as gather_mod
from mm_schedule.kernels.segment_copy.launch import gather_segments
from mm_schedule.kernels.tuned_configs import resolve_config

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("requested", "interpret", "device", "expected"),
    [
        ("auto", "1", "cpu", "torch"),
        ("auto", "0", "cpu", "torch"),
        (None, "1", "cpu", "torch"),
        ("torch", "1", "cpu", "torch"),
        ("triton", "1", "cpu", "triton"),
        ("TRITON ", "1", "cpu", "triton"),
        ("auto", "1", "cuda", "torch"),  # the interpreter cannot read device addresses
        ("auto", "0", "cuda", "triton"),
    ],
)
def test_selection(monkeypatch, requested, interpret, device, expected):
    if requested is None:
        monkeypatch.delenv("MM_SCHEDULE_KERNEL_BACKEND", raising=False)
    else:
        monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", requested)
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    refresh_backend()
    assert select_backend(torch.device(device)) == expected
    assert uses_triton(torch.device(device)) == (expected == "triton")


@pytest.mark.parametrize(
    ("requested", "interpret", "device", "message"),
    [
        ("cuda", "1", "cpu", "is not one of auto, triton, torch"),
        ("triton", "0", "cpu", "needs TRITON_INTERPRET=1"),
        ("triton", "1", "cuda", "only works for CPU tensors"),
    ],
)
def test_impossible_requests_raise(monkeypatch, requested, interpret, device, message):
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", requested)
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    with pytest.raises(KernelInputError, match=message):
        refresh_backend()
        select_backend(torch.device(device))


def test_the_environment_is_read_once_until_refreshed(monkeypatch):
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", "torch")
    refresh_backend()
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", "triton")
    assert select_backend(CPU) == "torch"  # the hot path does not look at os.environ
    refresh_backend()
    assert select_backend(CPU) == "triton"


def test_set_backend_overrides_the_environment(monkeypatch):
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", "triton")
    try:
        set_backend("torch")
        assert select_backend(CPU) == "torch"
        with pytest.raises(KernelInputError, match="not one of"):
            set_backend("cuda")
    finally:
        set_backend(None)
    assert select_backend(CPU) == "triton"


def test_torch_backend_never_touches_the_kernel(torch_backend, monkeypatch, helpers):
    class Exploding:
        def __getitem__(self, grid):
            raise AssertionError("kernel launched under the torch backend")

    monkeypatch.setattr(gather_mod, "segment_copy_kernel", Exploding())
    source = helpers.random_rows(6, 64, torch.float32)
    out = gather_segments([source], [(0, 2, 3, 0)], dtype=torch.bfloat16)
    assert torch.equal(out, source[2:5].to(torch.bfloat16))


def test_auto_on_cpu_uses_the_reference(monkeypatch, helpers):
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", "auto")
    refresh_backend()
    monkeypatch.setattr(gather_mod, "segment_copy_kernel", None)  # would fail if launched
    source = helpers.random_rows(4, 64, torch.float16)
    assert torch.equal(gather_segments([source], [(0, 0, 4, 0)]), source)


@pytest.mark.parametrize("kernel", ["segment_gather", "placeholder_merge"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hidden", [64, 1152, 3584, 16384])
@pytest.mark.parametrize("n_rows", [1, 1000, 100_000])
def test_heuristic_configs_are_valid_and_fill_vectors(kernel, dtype, hidden, n_rows):
    config = validate_config(heuristic_config(kernel, dtype=dtype, hidden=hidden, n_rows=n_rows))
    vec = 16 // dtype.itemsize
    # Every lane of every (64-lane) warp gets at least one full 16-byte vector per step.
    assert config["BLOCK_M"] * config["BLOCK_H"] >= vec * 64 * config["num_warps"]
    slow = unaligned_config(config)
    assert slow["BLOCK_M"] == config["BLOCK_M"] and slow["BLOCK_H"] <= config["BLOCK_H"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"BLOCK_M": 4, "BLOCK_H": 64, "num_warps": 4}, "lacks keys"),
        ({"BLOCK_M": 3, "BLOCK_H": 64, "num_warps": 4, "num_stages": 1}, "BLOCK_M=3"),
        ({"BLOCK_M": 4, "BLOCK_H": 64, "num_warps": 4, "num_stages": 0}, "num_stages"),
    ],
)
def test_bad_configs_are_rejected(config, message):
    with pytest.raises(KernelInputError, match=message):
        resolve_config(
            "segment_gather", dtype=torch.bfloat16, hidden=64, n_rows=1, device=CPU, config=config
        )


def test_resolved_config_has_the_contract_keys():
    config = resolve_config(
        "placeholder_merge", dtype=torch.float16, hidden=4096, n_rows=300, device=CPU
    )
    assert set(config) == {"BLOCK_M", "BLOCK_H", "num_warps", "num_stages"}


def test_importing_the_package_loads_neither_torch_nor_triton():
    code = (
        "import sys, mm_schedule.kernels as k; "
        "k.Segment(0, 0, 1, 0); "
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lazy_attributes_are_kept_after_the_first_access():
    code = (
        "import mm_schedule.kernels as k; "
        "assert 'gather_segments' not in vars(k); "
        "f = k.gather_segments; "
        "assert vars(k)['gather_segments'] is f is k.gather_segments; "
        "from mm_schedule.kernels.segment_copy.launch import gather_segments; assert f is gather_segments"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
