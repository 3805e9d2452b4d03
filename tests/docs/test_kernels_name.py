"""``import kernels`` from a checkout's root: the root is first on ``sys.path`` there (``python
-m pytest``, ``python -c``, a notebook), and its kernels/ folder must not stand in for Hugging
Face's package of that name, which transformers imports whenever it is installed."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300

# Run with the checkout's root as the working directory, so first on sys.path: transformers
# loads its kernel-hub integration while it builds a model.
PROBE = r"""
import json, sys
import torch, transformers as tf
config = tf.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1)
logits = tf.LlamaForCausalLM(config)(torch.tensor([[1, 2, 3]])).logits
import kernels, mm_schedule.kernels
from transformers.utils import import_utils
try:
    from kernels import get_kernel
    error = None
except ImportError as e:
    error = [type(e).__name__, str(e), e.name]
print(json.dumps({
    "first_on_path": sys.path[0], "logits": list(logits.shape),
    "kernels_file": getattr(kernels, "__file__", None), "kernels_version": getattr(kernels, "__version__", None),
    "ours": mm_schedule.kernels.__file__, "segment": mm_schedule.kernels.Segment.__module__,
    "available": bool(import_utils.is_kernels_available()), "import_error": error,
}))
"""


def _probe(*args: str) -> dict:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _hugging_face_kernels() -> metadata.Distribution:
    try:
        return metadata.distribution("kernels")
    except metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's kernels package is not installed (both pinned stacks install it)")


def test_import_kernels_from_the_checkout_root_is_hugging_faces_package():
    pytest.importorskip("transformers")
    dist = _hugging_face_kernels()
    got = _probe("-c", PROBE)
    assert os.path.realpath(got["first_on_path"] or ROOT) == str(ROOT)  # the root does come first
    assert got["logits"] == [1, 3, 32]
    assert got["kernels_file"] == str(dist.locate_file("kernels/__init__.py"))
    assert got["kernels_version"] == dist.version and got["import_error"] is None
    assert got["available"] is True  # transformers sees the installed package
    assert got["ours"] == str(ROOT / "kernels" / "__init__.py")
    assert got["segment"] == "mm_schedule.kernels.segment_copy.contract"


def test_pytest_run_from_the_root_gets_hugging_faces_package(tmp_path):
    """``python -m pytest`` from the root, as a new user runs the suite."""
    pytest.importorskip("transformers")
    dist = _hugging_face_kernels()
    test = tmp_path / "test_probe.py"
    test.write_text(
        "import sys\n"
        "def test_probe():\n"
        f"    assert sys.path[0] == {str(ROOT)!r}\n"
        "    import transformers.integrations.hub_kernels, kernels, mm_schedule.kernels\n"
        f"    assert kernels.__file__ == {str(dist.locate_file('kernels/__init__.py'))!r}\n"
        f"    assert mm_schedule.kernels.__file__ == {str(ROOT / 'kernels' / '__init__.py')!r}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib", "--rootdir", str(tmp_path),
         "-c", os.devnull,
         str(test)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr


def _site_without_kernels(tmp_path: Path) -> list[Path]:
    """This interpreter's site-packages folders as folders of links to every entry but Hugging
    Face's kernels package: an environment where it is not installed."""
    farms = []
    for i, folder in enumerate(site.getsitepackages()):
        farm = tmp_path / f"site{i}"
        farm.mkdir()
        for entry in Path(folder).iterdir():
            if entry.name == "kernels" or (entry.name.startswith("kernels-") and entry.name.endswith(".dist-info")):
                continue
            (farm / entry.name).symlink_to(entry)
        farms.append(farm)
    return farms


def test_without_hugging_faces_package_transformers_works_and_the_name_says_why(tmp_path):
    pytest.importorskip("transformers")
    farms = _site_without_kernels(tmp_path)
    # -S: no site-packages but the linked copies, whose .pth files (the editable install's) still run.
    setup = "import site\n" + "".join(f"site.addsitedir({str(f)!r})\n" for f in farms)
    got = _probe("-S", "-c", setup + PROBE)
    assert got["logits"] == [1, 3, 32]
    assert got["available"] is False
    assert got["kernels_file"] is None and got["kernels_version"] is None  # how transformers tells a stray folder
    kind, message, name = got["import_error"]
    assert kind == "ModuleNotFoundError" and name == "kernels"
    assert "Hugging Face's kernels package is not installed (pip install kernels)" in message
    assert f"the kernels/ folder in {ROOT} is this project's mm_schedule.kernels" in message
    assert got["ours"] == str(ROOT / "kernels" / "__init__.py")
    assert got["segment"] == "mm_schedule.kernels.segment_copy.contract"


def test_the_search_skips_the_checkout_root_however_it_is_written(tmp_path, monkeypatch):
    from mm_schedule.kernels._top_level_name import installed_spec

    elsewhere = tmp_path / "site"
    (elsewhere / "kernels").mkdir(parents=True)
    (elsewhere / "kernels" / "__init__.py").write_text("")
    link = tmp_path / "checkout"
    link.symlink_to(ROOT)
    monkeypatch.chdir(ROOT)
    for root in ("", ".", str(ROOT), str(link), str(ROOT / "kernels" / "..")):
        assert installed_spec([root], str(ROOT)) is None, root
        spec = installed_spec([root, str(elsewhere)], str(ROOT))
        assert spec is not None and spec.origin == str(elsewhere / "kernels" / "__init__.py"), root
