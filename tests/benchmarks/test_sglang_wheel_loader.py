"""The loader behind the side-by-side harness, on a small wheel built here (no network):
real modules run from the archive, everything else they import is an import-only stub
that refuses to be called, and ``sys.modules`` is left as it was."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest

LOADER = Path(__file__).resolve().parents[2] / "benchmarks" / "_sglang_wheels.py"

MM_SCHEDULE = '''
from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem
from sglang.srt.runtime_context import get_parallel
from sglang.srt.somewhere.heavy import build_engine
from sglang.srt.utils import is_hip

_is_hip = is_hip()
embedding_cache = None


def tp_size():
    return get_parallel().tp_size


def engine():
    return build_engine()
'''


def _loader():
    spec = importlib.util.spec_from_file_location("mm_sglang_wheels_under_test", LOADER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def release(tmp_path):
    wheels = _loader()
    with zipfile.ZipFile(tmp_path / "sglang-9.9.9-py3-none-any.whl", "w") as zf:
        zf.writestr("sglang/__init__.py", "raise RuntimeError('the package root must not run')\n")
        zf.writestr("sglang/srt/managers/mm_schedule.py", MM_SCHEDULE)
        zf.writestr("sglang/srt/managers/mm_utils.py", "from sglang.srt.managers.mm_schedule import tp_size\n")
    sys.modules.setdefault("sglang.sentinel", "kept")  # a caller's own entry survives the load
    try:
        yield wheels, wheels.load_release("9.9.9", cache=tmp_path)
    finally:
        sys.modules.pop("sglang.sentinel", None)


def test_real_modules_run_and_stubs_answer_as_a_single_cuda_process(release):
    _, rel = release
    assert set(rel.modules) == {"sglang.srt.managers.mm_schedule", "sglang.srt.managers.mm_utils"}
    assert rel.scheduler is rel.modules["sglang.srt.managers.mm_schedule"]
    assert rel.mm_utils.tp_size is rel.scheduler.tp_size
    assert rel.scheduler.tp_size() == 1 and rel.scheduler._is_hip is False
    assert rel.scheduler.Modality.VIDEO.name == "VIDEO"
    assert "sglang.srt.somewhere.heavy" in rel.stubbed and "sglang" in rel.stubbed


def test_an_import_only_stub_refuses_to_be_called(release):
    wheels, rel = release
    with pytest.raises(wheels.StubCalled, match=r"sglang\.srt\.somewhere\.heavy\.build_engine"):
        rel.scheduler.engine()


def test_sys_modules_is_left_as_it_was(release):
    assert sys.modules.get("sglang.sentinel") == "kept"
    assert [k for k in sys.modules if k.startswith("sglang") and k != "sglang.sentinel"] == []


def test_a_missing_wheel_without_a_registry_is_reported(tmp_path, monkeypatch):
    wheels = _loader()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    with pytest.raises(wheels.WheelUnavailable, match=r"sglang==0\.0\.1"):
        wheels.fetch_wheel("0.0.1", cache=tmp_path)
