"""The kernel registry is the one place naming each kernel's code and tooling, and the
serving path never loads the tooling."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mm_schedule.errors import KernelInputError
from mm_schedule.kernels import registry
from mm_schedule.kernels.dtypes import KERNEL_DTYPES, kernel_dtype, vector_width
from mm_schedule.kernels.launch_config import heuristic_config

REPO = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


@pytest.mark.parametrize("name", registry.KERNEL_NAMES)
def test_every_entry_resolves_to_real_code(name):
    import mm_schedule.kernels as package
    from mm_schedule.kernels.tools.cases import Case

    entry = registry.kernel_entry(name)
    module = __import__(f"mm_schedule.kernels.{entry.module}", fromlist=["_"])
    assert callable(getattr(module, entry.reference))
    for launcher in entry.launchers:
        assert launcher in package.__all__, launcher
        assert callable(getattr(package, launcher))
    from mm_schedule.kernels.tools.aot import SPEC_BUILDERS
    from mm_schedule.kernels.tools.cases import CASES

    # The tooling is keyed by the registry's names, every kernel in both tables.
    assert set(CASES) == set(SPEC_BUILDERS) == set(registry.KERNEL_NAMES)
    assert issubclass(CASES[name], Case)
    assert callable(SPEC_BUILDERS[name])
    # The heuristic accepts exactly the registered names.
    assert set(heuristic_config(name, dtype=None, hidden=64, n_rows=1)) == {
        "BLOCK_M", "BLOCK_H", "num_warps", "num_stages",
    }  # fmt: skip


def test_unknown_kernel_names_the_known_ones():
    with pytest.raises(KernelInputError, match="segment_gather"):
        registry.kernel_entry("softmax")


def test_dtype_table():
    assert {d.short for d in KERNEL_DTYPES.values()} == {"bf16", "fp16", "fp32"}
    assert kernel_dtype("torch.float32").vector_elements == 4
    assert vector_width(4, 2) == 8
    with pytest.raises(KernelInputError, match="float64"):
        kernel_dtype("float64", "source 3")


def test_serving_path_never_imports_the_tooling():
    code = """
import sys, torch
from mm_schedule.kernels import gather_segments, merge_segments, merge_by_placeholder_ids
src = [torch.randn(5, 64, dtype=torch.bfloat16)]
out = gather_segments(src, [(0, 1, 3, 0)])
assert torch.equal(out, src[0][1:4])
ids = torch.tensor([1, 7, 7, 2])
merge_by_placeholder_ids(ids, 7, src[0][:2], torch.zeros(4, 64, dtype=torch.bfloat16))
loaded = sorted(m for m in sys.modules if m.startswith("mm_schedule.kernels.tools"))
assert not loaded, loaded
"""
    env = dict(os.environ, TRITON_INTERPRET="1", MM_SCHEDULE_KERNEL_BACKEND="triton")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_packaging_lists_every_kernel_package_and_the_tuner_entry_point():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = set(project["tool"]["setuptools"]["packages"])
    for init in (REPO / "kernels").rglob("__init__.py"):
        relative = init.parent.relative_to(REPO / "kernels").parts
        assert ".".join(("mm_schedule", "kernels", *relative)) in packages, init
    target = project["project"]["scripts"]["mm-schedule-tune"]
    module, _, function = target.partition(":")
    assert callable(getattr(__import__(module, fromlist=["_"]), function))


def test_the_registry_names_no_tooling_and_the_config_chain_runs_one_way():
    def imports(path):
        return [line for line in (REPO / "kernels" / path).read_text().splitlines()
                if line.lstrip().startswith(("import ", "from "))]  # fmt: skip

    for entry in registry.KERNELS.values():
        assert not any("tools" in str(v) for v in vars(entry).values()), entry
    assert not any("tools" in line for line in imports("registry.py"))
    # launch_config (heuristics) never imports tuned_configs, which imports it.
    assert not any("tuned_configs" in line for line in imports("launch_config.py"))
    assert any("launch_config" in line for line in imports("tuned_configs.py"))
