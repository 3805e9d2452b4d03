"""The commands a newcomer and CI run: the README opens with `make demo` and `make test`,
and CI runs the demo's checks once more on another numeric path."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> list[str]:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert match, f"no {target} target"
    return [line.strip() for line in match.group(1).splitlines()]


def test_readme_opens_with_exactly_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.match(r"# [^\n]+\n\n```\n(.*?)```", readme, re.S)
    assert block, "the README must open with a code block"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]


def test_ci_runs_the_tests_then_the_demo_checks_on_another_numeric_path_then_the_second_stack():
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
             if line.strip().startswith("make ")]
    assert steps == ["make test", "make demo-checks", "make test-stack2"]
    (command,) = _recipe("demo-checks")
    assert "examples/demo.py --checks-only" in command
    # Any one of these moves the arithmetic off the default SIMD / BLAS / threading path.
    assert re.search(r"ATEN_CPU_CAPABILITY=default|MKL_ENABLE_INSTRUCTIONS=AVX2|--threads 1", command)


def test_the_second_stack_runs_the_whole_suite_in_its_own_environment():
    (command,) = _recipe("test-stack2")
    assert command.startswith("TRITON_INTERPRET=1 $(STACK2_BIN)/python -m pytest")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    pins = re.search(r"^STACK2_PINS\s*:=(.*)$", makefile, re.M).group(1).split()
    for pin in ("torch==2.11.0", "triton==3.6.0"):
        assert pin in pins
    assert any(p.startswith("transformers==5.") for p in pins) and any(p.startswith("numpy==2.") for p in pins)
    assert re.search(r"^STACK2_VENV\s*:=\s*\.venv-stack2$", makefile, re.M)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`make test-stack2`" in readme
