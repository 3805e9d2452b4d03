"""The integrations are optional: importing them loads only what they need."""

from __future__ import annotations

import json
import subprocess
import sys

# Statements in the order of what they may load, run one after another in one fresh
# interpreter: each may add only its own heavy modules to what the earlier ones loaded.
STATEMENTS = [
    ("import mm_schedule.integrations, mm_schedule.integrations.sglang", set()),
    ("from mm_schedule import content_hash", set()),
    ("import mm_schedule; mm_schedule.kernels; mm_schedule.codemods", set()),
    ("from mm_schedule.codemods.movemap.schema import load_map; load_map()", set()),
    ("import mm_schedule.integrations.transformers", {"torch"}),
]
HEAVY = ("torch", "transformers", "triton")


def test_each_import_loads_only_what_it_needs():
    code = "\n".join([
        "import json, sys",
        "loaded = []",
        *(f"{statement}\nloaded.append([m for m in {HEAVY!r} if m in sys.modules])" for statement, _ in STATEMENTS),
        "print(json.dumps(loaded))",
    ])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert {s: set(got) for (s, _), got in zip(STATEMENTS, loaded)} == dict(STATEMENTS)
