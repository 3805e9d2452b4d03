"""Fixtures of the SGLang stand-in's tests: SGLang's real modules from its wheels (loaded
once per session) and the assembly backend. Marker ``realworld`` on the tests that need
a wheel: they skip when the package registry cannot be reached and no wheel is cached."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _process_module():
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import _sglang_process

    return _sglang_process


@pytest.fixture(scope="session")
def sglang_releases():
    """``version -> SGLangProcess``, each release loaded on first use."""
    process = _process_module()
    loaded: dict[str, object] = {}

    def get(version: str):
        if version not in loaded:
            try:
                loaded[version] = process.SGLangProcess(version)
            except process.wheels.WheelUnavailable as exc:
                pytest.skip(f"SGLang {version} wheel unavailable (registry unreachable?): {exc}")
        return loaded[version]

    return get


def pytest_addoption(parser):
    parser.addoption("--sglang-release", default="all",
                     help="SGLang releases (comma-separated, or 'all' known) whose modules (from their wheels)"
                          " the stand-in is compared with")


def pytest_generate_tests(metafunc):
    if "sglang" in metafunc.fixturenames:
        from mm_schedule.integrations.sglang import KNOWN

        chosen = metafunc.config.getoption("--sglang-release", default="all")
        releases = list(KNOWN) if chosen == "all" else chosen.split(",")
        metafunc.parametrize("sglang_release", releases, scope="session")


@pytest.fixture(scope="session")
def sglang(sglang_releases, sglang_release):
    """The real modules of one SGLang release (each known one in turn, or those given by
    ``--sglang-release``; not registered in ``sys.modules``: enter it for that)."""
    return sglang_releases(sglang_release)


@pytest.fixture
def standin(request):
    """The stand-in as the module of the release under test (the newest known release
    for a test without one), with a fresh cache and the single-process step context."""
    from mm_schedule.integrations.sglang import standin as module
    from mm_schedule.integrations.sglang.versions import NEWEST

    version = request.getfixturevalue("sglang_release") if "sglang_release" in request.fixturenames else NEWEST
    module.use_release(version)
    module.set_step_context(None)
    module.embedding_cache = None
    yield module
    module.set_step_context(None)
    module.embedding_cache = None
    module.use_release(NEWEST)


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    from mm_schedule.kernels.segment_copy.trusted import forget_backend_choice

    if request.param == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", request.param)
    forget_backend_choice()
    yield request.param
    monkeypatch.undo()
    forget_backend_choice()


@pytest.fixture(params=["torch", "triton"])
def copy_backend(request, monkeypatch):
    """The vLLM integration's copy backend, its launcher chosen afresh."""
    from mm_schedule.kernels.backend import refresh_backend

    if request.param == "triton":
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            pytest.skip("run with TRITON_INTERPRET=1 (as `make test` does) to run the Triton kernels on CPU tensors")
        pytest.importorskip("triton")
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", request.param)
    refresh_backend()
    import mm_schedule.kernels.segment_copy.trusted as trusted

    trusted._triton_launcher.cache_clear()
    yield request.param
    monkeypatch.undo()
    refresh_backend()
    trusted._triton_launcher.cache_clear()


@pytest.fixture(scope="session")
def sglang_wheels():
    """``benchmarks/_sglang_wheels``: downloads and reads SGLang's official wheels."""
    return _process_module().wheels
