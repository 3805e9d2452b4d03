"""Kernel tests run the Triton kernels on CPU tensors through the Triton interpreter.

``TRITON_INTERPRET`` must be set before triton decorates the kernels, so it is set here,
before any test module imports ``mm_schedule.kernels`` (``make test`` sets it anyway).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from importlib.util import find_spec

import pytest
import torch

# Test modules that need a package the GPU tests do not: without it they are left out of
# collection (named in the report header) instead of stopping every other module.
OPTIONAL_IMPORTS = {
    "hypothesis": (
        "test_embed_lookup.py",
        "test_gather.py",
        "test_merge.py",
        "test_placeholder_merge.py",
        "test_tuned_configs.py",
    ),
}
MISSING = {name: modules for name, modules in OPTIONAL_IMPORTS.items() if find_spec(name) is None}
collect_ignore = [module for modules in MISSING.values() for module in modules]


def pytest_report_header(config):
    return [f"tests/kernels: {name} is not installed, not collected: {', '.join(modules)}"
            for name, modules in MISSING.items()]

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


@pytest.fixture(autouse=True)
def fresh_backend_choice():
    """The backend choice is read once per process; re-read it around every test, so a
    test that changes the environment (monkeypatch) sees its own setting and no other."""
    from mm_schedule.kernels.backend import refresh_backend

    refresh_backend()
    yield
    refresh_backend()


def _force(monkeypatch, name):
    from mm_schedule.kernels.backend import refresh_backend

    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", name)
    refresh_backend()


@pytest.fixture
def triton_backend(monkeypatch):
    """Force the Triton kernels (interpreted) for the duration of a test."""
    _force(monkeypatch, "triton")


@pytest.fixture
def torch_backend(monkeypatch):
    _force(monkeypatch, "torch")


def poisoned(shape, dtype):
    """A tensor every kernel must overwrite or leave alone visibly: all NaN."""
    return torch.full(shape, float("nan"), dtype=dtype)


def assert_bitwise_equal(actual, expected):
    """Equal bit patterns (NaN poison compares equal to itself), naming the first bad row."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if actual.numel() == 0:
        return
    a = actual.contiguous().view(_BITS[actual.element_size()])
    e = expected.contiguous().view(_BITS[expected.element_size()])
    bad = (a != e).reshape(a.shape[0], -1).any(dim=1) if a.dim() else (a != e)
    if bad.any():
        row = int(bad.nonzero()[0, 0])
        raise AssertionError(
            f"row {row} differs: got {actual[row][:8]}, expected {expected[row][:8]}"
        )


def random_rows(n_rows, hidden, dtype, generator=None):
    return (torch.randn(n_rows, hidden, generator=generator) * 3).to(dtype)


@pytest.fixture
def helpers():
    class Helpers:
        pass

    h = Helpers()
    h.poisoned = poisoned
    h.assert_bitwise_equal = assert_bitwise_equal
    h.random_rows = random_rows
    h.FLOAT_DTYPES = FLOAT_DTYPES
    return h


@pytest.fixture(scope="session")
def aot_cache_dir(tmp_path_factory):
    """One Triton cache for every ahead-of-time compile of the session: a kernel variant
    two AOT test modules both compile is built once."""
    return str(tmp_path_factory.mktemp("triton-aot-cache"))


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA or ROCm device with the kernels compiled for it and the Triton backend forced;
    the GPU tests (``-m gpu``, run by the GPU check) skip without one."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm device")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("the kernels must be compiled for the GPU: run with TRITON_INTERPRET=0")
    _force(monkeypatch, "triton")
    return torch.device("cuda")
