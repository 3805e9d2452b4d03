"""The codemod benchmark scripts run end to end on tiny inputs and write their sections
(the numbers themselves are the scripts' business, not the tests')."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(script: str, *args: str) -> None:
    subprocess.run([sys.executable, str(BENCH / script), *args], check=True, capture_output=True, text=True,
                   timeout=300)


def test_many_imports_bench_writes_its_section_and_every_file_is_rewritten(tmp_path):
    out = tmp_path / "codemod.md"
    out.write_text("# Codemod\n\n## Another section\n\nkept\n")
    _run("bench_codemod_imports.py", "--lines", "3", "40", "--out", str(out))
    text = out.read_text()
    assert "## Another section\n\nkept\n" in text
    section = text[text.index("## Many one-name imports"):]
    rows = [line for line in section.splitlines() if line.startswith("| 3 |") or line.startswith("| 40 |")]
    assert len(rows) == 2 and all(row.rstrip().endswith("| yes |") for row in rows)


def test_large_file_bench_compares_every_shape_with_the_whole_file_pass(tmp_path):
    out = tmp_path / "codemod.md"
    _run("bench_codemod_large.py", "--mb", "0.03", "--cap", "120", "--out", str(out))
    section = out.read_text()
    rows = [line for line in section.splitlines() if line.startswith("| ") and "bytes" not in line
            and not line.startswith("|---")]
    assert len(rows) == 3
    assert all("| yes |" in row for row in rows), rows
