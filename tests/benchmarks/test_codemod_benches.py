"""The codemod benchmark scripts run end to end on tiny inputs and write their sections
(the numbers themselves are the scripts' business, not the tests').

Each script's ``main`` runs in this process (it starts its own fresh subprocess per
measured run): one interpreter start-up and libcst import fewer per test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def _run(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their helpers as top-level modules

    def run(script: str, *args: str) -> None:
        spec = importlib.util.spec_from_file_location(f"_{Path(script).stem}_under_test", BENCH / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.main(list(args)) == 0

    return run


def test_many_imports_bench_writes_its_section_and_every_file_is_rewritten(tmp_path, _run):
    out = tmp_path / "codemod.md"
    out.write_text("# Codemod\n\n## Another section\n\nkept\n")
    _run("bench_codemod_imports.py", "--lines", "3", "40", "--out", str(out))
    text = out.read_text()
    assert "## Another section\n\nkept\n" in text
    section = text[text.index("## Many one-name imports"):]
    rows = [line for line in section.splitlines() if line.startswith("| 3 |") or line.startswith("| 40 |")]
    assert len(rows) == 2 and all(row.rstrip().endswith("| yes |") for row in rows)


def test_large_file_bench_compares_every_shape_with_the_whole_file_pass(tmp_path, _run):
    out = tmp_path / "codemod.md"
    _run("bench_codemod_large.py", "--mb", "0.03", "--cap", "120", "--out", str(out))
    section = out.read_text()
    rows = [line for line in section.splitlines() if line.startswith("| ") and "bytes" not in line
            and not line.startswith("|---")]
    assert len(rows) == 3
    assert all("| yes |" in row for row in rows), rows
