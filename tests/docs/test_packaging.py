"""What an install from a wheel or sdist gets: every package folder is listed in
pyproject.toml (an editable install finds unlisted ones anyway, so nothing else would
notice one missing), and every C helper's source exists."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def test_every_package_folder_is_listed():
    found = set()
    for package, folder in CONFIG["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            parts = init.parent.relative_to(base).parts
            found.add(".".join((package, *parts)))
    assert found, "no package folder found"
    assert sorted(found - set(CONFIG["packages"])) == []
    assert sorted(set(CONFIG["packages"]) - found) == []


def test_c_helpers_are_optional_and_their_sources_exist():
    modules = CONFIG["ext-modules"]
    assert modules
    for module in modules:
        assert module["optional"] is True, module["name"]  # an install without a compiler must not fail
        for source in module["sources"]:
            assert (ROOT / source).is_file(), source
        package, _, name = module["name"].rpartition(".")
        assert package in CONFIG["packages"] and name.startswith("_")
