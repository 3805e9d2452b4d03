"""The integrations are optional: importing them loads only what they need."""

from __future__ import annotations

import subprocess
import sys


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_package_imports_nothing_heavy():
    assert _loaded_after("import mm_schedule.integrations, mm_schedule.integrations.sglang") == set()
    assert _loaded_after("from mm_schedule import content_hash") == set()


def test_transformers_adapter_needs_torch_but_not_transformers():
    assert _loaded_after("import mm_schedule.integrations.transformers") == {"torch"}
