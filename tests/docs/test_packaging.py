"""What a user gets from a release: the wheel built from the sdist (as pip builds it),
installed into a fresh virtual environment, not the editable install the suite runs from.

The wheel is built and installed once for the module; each test reads one part of what
a few subprocesses found there. The fresh environment gets its dependencies (torch,
libcst) from this interpreter's site-packages, after its own, as
``--system-site-packages`` would give them: nothing is downloaded.
"""

from __future__ import annotations

import ast
import json
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CONFIG = PYPROJECT["tool"]["setuptools"]
TIMEOUT_S = 300  # building compiles the C helpers; the two cores are often shared
# A module the codemod moves, as a user's file would import it.
OLD_IMPORT = "from sglang.srt.managers.mm_utils import PerImageRequestInfo\n"

# Run by the installed environment's interpreter, outside the checkout, with torch made
# unimportable (what an environment without torch looks like to an import): everything
# but the scheduler's and kernels' torch code must work, and that code must say it needs torch.
WITHOUT_TORCH = r"""
import importlib.metadata as md, importlib.resources as res, json, sys
sys.modules["torch"] = None
import mm_schedule
out = {"file": mm_schedule.__file__, "version": mm_schedule.__version__}
dist = md.distribution("mm-schedule")
out["metadata_version"] = dist.version
out["requires"] = dist.requires or []
out["license_expression"] = dist.metadata.get("License-Expression")
out["license_files"] = dist.metadata.get_all("License-File") or []
out["license_text"] = dist.read_text("licenses/LICENSE")
out["py_typed"] = res.files("mm_schedule").joinpath("py.typed").is_file()
out["subpackages"] = {n: getattr(mm_schedule, n).__file__ for n in ("kernels", "codemods", "integrations")}
from mm_schedule.codemods.movemap.schema import load_map
out["map_module"] = load_map().new_module
errors = {}
for what in ("merge_chunk", "kernels.gather_segments"):
    try:
        obj = mm_schedule
        for part in what.split("."):
            obj = getattr(obj, part)
    except ModuleNotFoundError as error:
        errors[what] = [type(error).__name__, str(error), error.name]
out["errors"] = errors
print(json.dumps(out))
"""

WITH_TORCH = r"""
import json, torch, mm_schedule
from mm_schedule import MMItem, RequestChunk, embed_chunk
rows = torch.randn(4, 8)
item = MMItem(hash=7, offsets=[(1, 4)], feature=rows)
got = embed_chunk([RequestChunk([item], 0, 6)], lambda items: [it.feature for it in items]).embedding
print(json.dumps({
    "file": mm_schedule.__file__,
    "kernels": mm_schedule.kernels.__file__,
    "gather_segments": callable(mm_schedule.kernels.gather_segments),
    "rows_exact": bool(torch.equal(got, rows)),
}))
"""

# From the checkout's root, where its mm_schedule/ folder shadows the installed package.
FROM_CHECKOUT = r"""
import json, mm_schedule, mm_schedule.codemods, mm_schedule.kernels
print(json.dumps({n: m.__file__ for n, m in
                  (("package", mm_schedule), ("codemods", mm_schedule.codemods), ("kernels", mm_schedule.kernels))}))
"""


def _run(*args: str, cwd: Path, env_python: str | Path = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(env_python), *args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("release")
    build_log = []
    proc = _run("-c", "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))",
                str(tmp), cwd=ROOT)
    build_log.append(proc.stdout + proc.stderr)
    sdist = tmp / _ok(proc).split()[-1]
    proc = _run("-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index",
                "-w", str(tmp), str(sdist), cwd=tmp)
    build_log.append(proc.stdout + proc.stderr)
    _ok(proc)
    (wheel,) = tmp.glob("mm_schedule-*.whl")

    venv = tmp / "venv"
    _ok(_run("-m", "venv", "--without-pip", str(venv), cwd=tmp))
    python = venv / "bin" / "python"
    proc = _run("-m", "pip", "--python", str(python), "install", "-v", "--no-deps", "--no-index", str(wheel), cwd=tmp)
    build_log.append(proc.stdout + proc.stderr)
    _ok(proc)
    (own_site,) = venv.glob("lib/python*/site-packages")
    (own_site / "_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    old = tmp / "old.py"
    old.write_text(OLD_IMPORT)
    return {
        "venv": venv,
        "wheel": wheel,
        "build_log": "\n".join(build_log),
        "without_torch": json.loads(_ok(_run("-c", WITHOUT_TORCH, cwd=tmp, env_python=python))),
        "with_torch": json.loads(_ok(_run("-c", WITH_TORCH, cwd=tmp, env_python=python))),
        "from_checkout": json.loads(_ok(_run("-c", FROM_CHECKOUT, cwd=ROOT, env_python=python))),
        "codemod_from_checkout": _run("-m", "mm_schedule.codemods", "--diff", str(old), cwd=ROOT, env_python=python),
        "console_script": _run("--help", cwd=tmp, env_python=venv / "bin" / "mm-schedule-codemod"),
    }


def test_the_package_comes_from_the_wheel_not_the_checkout(installed):
    venv = str(installed["venv"])
    assert installed["without_torch"]["file"].startswith(venv)
    assert installed["with_torch"]["file"].startswith(venv)
    assert all(path.startswith(venv) for path in installed["without_torch"]["subpackages"].values())


def test_the_version_is_written_once(installed):
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    source = ast.parse((ROOT / "mm_schedule" / "__init__.py").read_text(encoding="utf-8"))
    (version,) = [node.value.value for node in source.body if isinstance(node, ast.Assign)
                  and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"]]
    got = installed["without_torch"]
    assert got["version"] == got["metadata_version"] == version
    assert installed["wheel"].name.startswith(f"mm_schedule-{version}-")
    assert re.search(rf"^## \[{re.escape(version)}\]", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)


def test_license_file_is_apache_2_and_ships_in_the_metadata(installed):
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text) > 10_000  # the whole text, not a stub
    got = installed["without_torch"]
    assert got["license_expression"] == "Apache-2.0"
    assert got["license_files"] == ["LICENSE"] and got["license_text"] == text


def test_typed_package(installed):
    assert installed["without_torch"]["py_typed"]


def test_subpackages_are_attributes_and_need_torch_only_where_torch_is_used(installed):
    got = installed["without_torch"]
    assert sorted(got["subpackages"]) == ["codemods", "integrations", "kernels"]
    assert got["map_module"] == "sglang.srt.managers.mm_schedule"  # the codemod's data shipped too
    assert sorted(got["errors"]) == ["kernels.gather_segments", "merge_chunk"]
    for what, (kind, message, name) in got["errors"].items():
        assert kind == "ModuleNotFoundError" and name == "torch"
        assert message.startswith(f"mm_schedule.{what} needs torch, which is not installed: pip install")
        assert "mm-schedule[torch]" in message
    with_torch = installed["with_torch"]
    assert with_torch["kernels"].startswith(str(installed["venv"]))
    assert with_torch["gather_segments"] and with_torch["rows_exact"]


def test_codemod_runs_from_the_checkout_root(installed):
    """There the checkout's mm_schedule/ folder comes first on sys.path and holds neither
    kernels/ nor codemods/: they are found beside it."""
    paths = installed["from_checkout"]
    assert paths["package"] == str(ROOT / "mm_schedule" / "__init__.py")
    assert paths["codemods"] == str(ROOT / "codemods" / "__init__.py")
    assert paths["kernels"] == str(ROOT / "kernels" / "__init__.py")
    proc = installed["codemod_from_checkout"]
    assert proc.returncode in (0, 1), proc.stderr  # 1: there are changes to make
    assert "+from sglang.srt.managers.mm_schedule import PerImageRequestInfo" in proc.stdout, proc.stdout
    script = installed["console_script"]
    assert script.returncode == 0 and script.stdout.startswith("usage: mm-schedule-codemod"), script.stderr


def test_build_and_install_print_no_warnings(installed):
    log = installed["build_log"]
    assert "Successfully installed mm-schedule" in log
    worrying = [
        line.strip() for line in log.splitlines()
        if re.search(r"warn", line, re.I)
        # distutils notes this whenever PYTHONDONTWRITEBYTECODE is set; nothing is wrong
        and "byte-compiling is disabled" not in line
    ]
    assert worrying == []


def _top_level_imports(tree: ast.AST, *, on_load_only: bool = False) -> set[str]:
    """Top-level names of the modules ``tree`` imports: statements and ``pytest.importorskip``;
    ``on_load_only``: those that run when the module is loaded, not inside its functions."""
    found = set()
    nodes = [tree]
    while nodes:
        node = nodes.pop()
        if on_load_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        nodes.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value)
    return {name.split(".")[0] for name in found}


def _third_party_imports() -> set[str]:
    """Top-level modules the tests, the demo and the benchmarks import that are neither the
    standard library nor this repository's."""
    folders = [ROOT / "tests", ROOT / "examples", ROOT / "benchmarks"]
    # sglang and vllm are the peers the suite loads from their own wheels, never installed.
    local = {"mm_schedule", "tests", "kernels", "codemods", "sglang", "vllm"}
    for folder in folders:
        local |= {p.stem for p in folder.rglob("*.py")} | {p.name for p in folder.rglob("*") if p.is_dir()}
    found = set()
    for folder in folders:
        for path in folder.rglob("*.py"):
            found |= _top_level_imports(ast.parse(path.read_text(encoding="utf-8")))
    return found - local - set(sys.stdlib_module_names)


def _sglang_module_imports() -> set[str]:
    """What the SGLang modules the suite runs from the wheels (the loader's REAL_MODULES)
    import on load besides sglang, in every wheel already in the wheel cache (PIL is one)."""
    import zipfile

    from mm_schedule.codemods.movemap.sources import default_wheel_cache

    loader = ast.parse((ROOT / "benchmarks" / "_sglang_wheels.py").read_text(encoding="utf-8"))
    (modules,) = [ast.literal_eval(node.value) for node in loader.body if isinstance(node, ast.Assign)
                  and [getattr(t, "id", None) for t in node.targets] == ["REAL_MODULES"]]
    found = set()
    for wheel in sorted(default_wheel_cache().glob("sglang-*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
            for module in modules:
                base = module.replace(".", "/")
                for member in (f"{base}.py", f"{base}/__init__.py"):
                    if member in names:
                        found |= _top_level_imports(ast.parse(archive.read(member)), on_load_only=True)
    return found - {"sglang"} - set(sys.stdlib_module_names)


def _requirement_name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def _makefile_pins() -> dict[str, set[str]]:
    """Distributions each environment's stamp recipe installs: ``main`` (.venv) and ``stack2``."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    variables = dict(re.findall(r"^([A-Z0-9_]+)\s*[:?]?=\s*(.*)$", makefile, re.M))

    def expand(text: str) -> str:
        while (ref := re.search(r"\$\(([A-Z0-9_]+)\)", text)):
            text = text.replace(ref.group(), variables.get(ref.group(1), ""))
        return text

    pins = {}
    for env, stamp in (("main", "$(STAMP)"), ("stack2", "$(STACK2_STAMP)")):
        recipe = re.search(rf"^{re.escape(stamp)}:.*\n((?:\t.*\n)+)", makefile, re.M)
        assert recipe, f"no {stamp} target"
        installs = [expand(line) for line in recipe.group(1).splitlines() if "pip install" in line]
        pins[env] = {_requirement_name(token) for line in installs for token in line.split() if "==" in token}
    return pins


def test_dev_extra_and_both_makefile_stacks_install_what_the_suite_imports():
    from importlib.metadata import packages_distributions

    declared = {_requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    declared |= {_requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    pins = _makefile_pins()
    assert {"torch", "triton", "transformers", "numpy"} <= pins["main"] & pins["stack2"]  # the parse finds pins
    distributions = packages_distributions()
    imported = _third_party_imports()
    assert {"torch", "numpy", "pytest", "transformers", "yaml"} <= imported  # the scan sees the suite's imports
    imported |= _sglang_module_imports()
    missing = {}
    for module in sorted(imported):
        names = {_requirement_name(d) for d in distributions.get(module, [module])}
        for where, provided in (("dev extra", declared), *pins.items()):
            if not names & provided:
                missing.setdefault(module, []).append(where)
    assert missing == {}
    # Whatever the extra promises, both pinned stacks install (Hugging Face's kernels among them).
    assert {env: sorted(declared - provided) for env, provided in pins.items()} == {"main": [], "stack2": []}


def test_the_wheel_metadata_carries_the_dev_extra(installed):
    dev = {_requirement_name(r) for r in installed["without_torch"]["requires"] if 'extra == "dev"' in r}
    assert dev == {_requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}


def test_every_package_folder_is_listed():
    """An editable install finds unlisted folders anyway, so nothing else would notice one
    missing from the wheel. Data folders (the codemod's maps) are listed as packages so
    that setuptools ships them without a warning."""
    found = set()
    for package, folder in CONFIG["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            parts = init.parent.relative_to(base).parts
            found.add(".".join((package, *parts)))
    data = {package for package in CONFIG["package-data"] if package not in found}
    assert found, "no package folder found"
    assert sorted(found - set(CONFIG["packages"])) == []
    assert sorted(set(CONFIG["packages"]) - found - data) == []


def test_checkout_finder_maps_what_pyproject_maps():
    import mm_schedule

    mapped = {package.removeprefix("mm_schedule."): folder for package, folder in CONFIG["package-dir"].items()
              if package != "mm_schedule"}
    assert mm_schedule._CHECKOUT_FOLDERS == mapped


def test_c_helpers_are_optional_and_their_sources_exist():
    import runpy

    extensions = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")["EXTENSIONS"]
    # The Makefile reinstalls when one of them changes: it must list exactly these sources.
    make = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    listed = re.search(r"^C_SOURCES\s*:=(.*)$", make, re.M).group(1).split()
    assert sorted(listed) == sorted(source for extension in extensions for source in extension.sources)
    for extension in extensions:
        assert extension.optional is True, extension.name  # an install without a compiler must not fail
        for source in extension.sources:
            assert (ROOT / source).is_file(), source
        package, _, name = extension.name.rpartition(".")
        assert package in CONFIG["packages"] and name.startswith("_")
