"""The machinery both peer loaders share (``benchmarks/_peer_wheels.py``), through the vLLM
loader on a source folder built here (no network): real modules run, import-only stubs
leave decorators alone while loading and refuse to be called afterwards, and
``sys.modules`` is left as it was."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

INPUTS = '''
from vllm.logger import init_logger
from vllm.heavy.compile import support_torch_compile

logger = init_logger(__name__)


@support_torch_compile
def placeholder_range(offset, length):
    return (offset, length)
'''

UTILS = '''
from vllm.multimodal.inputs import placeholder_range
from vllm.heavy.engine import build_engine


def window(offset, length):
    return placeholder_range(offset, length)


def engine():
    return build_engine()
'''


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def release(tmp_path):
    loader = _load("_vllm_wheel")
    root = loader.source_dir("9.9.9", tmp_path)
    (root / "vllm/multimodal").mkdir(parents=True)
    (root / "vllm/multimodal/inputs.py").write_text(INPUTS)
    (root / "vllm/multimodal/utils.py").write_text(UTILS)
    (root / loader.MANIFEST).write_text(json.dumps({"wheel": "vllm-9.9.9-py3-none-any.whl", "members": []}))
    sys.modules.setdefault("vllm.sentinel", "kept")
    try:
        yield loader, loader.load_release("9.9.9", cache=tmp_path)
    finally:
        sys.modules.pop("vllm.sentinel", None)


def test_real_modules_run_and_a_stub_decorator_leaves_the_function(release):
    _, rel = release
    assert set(rel.modules) == {"vllm.multimodal.inputs", "vllm.multimodal.utils"}
    assert rel.modules["vllm.multimodal.utils"].window(3, 4) == (3, 4)
    assert rel.inputs.logger.name == "vllm.multimodal.inputs"
    assert "vllm.heavy.engine" in rel.stubbed and rel.encoder_runner is None


def test_a_stub_refuses_to_be_called_after_loading(release):
    loader, rel = release
    with pytest.raises(loader.StubCalled, match=r"vllm\.heavy\.engine\.build_engine"):
        rel.modules["vllm.multimodal.utils"].engine()


def test_sys_modules_is_left_as_it_was(release):
    assert sys.modules.get("vllm.sentinel") == "kept"
    assert [k for k in sys.modules if k.startswith("vllm") and k != "vllm.sentinel"] == []


def test_both_loaders_share_one_machinery():
    sglang, vllm = _load("_sglang_wheels"), _load("_vllm_wheel")
    assert sglang.WheelUnavailable is vllm.WheelUnavailable
    assert sglang.StubCalled is vllm.StubCalled
