"""Files made of many one-name imports of moved names: time against the number of lines.

Each generated module imports the new module once, then has N statements
``from <old module> import <moved name> as cI`` (the shipped map's moved names, in
turn) and one line using them all; every one of those names merges into the first
import. Each size is migrated in a fresh subprocess by ``migrate_source``; wall time,
CPU time and peak RSS come from the subprocess. The time per line should not grow with N.

    python benchmarks/bench_codemod_imports.py [--lines 100 400 1600] [--cap 300]

To measure another checkout, run this file with that checkout's interpreter. The table
replaces the "Many one-name imports" section of ``benchmarks/results/codemod.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from _results_file import replace_section

RESULTS = Path(__file__).resolve().parent / "results" / "codemod.md"
SECTION = "## Many one-name imports"

RUNNER = """
import json, resource, sys, time
from mm_schedule.codemods.movemap.schema import load_map
from mm_schedule.codemods.engine.transform import migrate_source
source = open(sys.argv[1], "rb").read()
move_map = load_map()
start, cpu = time.perf_counter(), time.process_time()
outcome = migrate_source(source, move_map, path="many.py", package="app")
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "changed": outcome.new_source is not None and outcome.new_source != source}))
"""

MOVED_NAMES = """
from mm_schedule.codemods.movemap.schema import load_map
print(" ".join(sorted(load_map().moved)))
"""


def generate(lines: int, names: list[str]) -> bytes:
    move = [f"{old} as c{i}" for i, old in zip(range(lines), names * (lines // len(names) + 1))]
    old_module = "sglang.srt.managers.mm_utils"
    text = ["from sglang.srt.managers.mm_schedule import get_embedding_chunk", ""]
    text += [f"from {old_module} import {alias}" for alias in move]
    text += ["", "USED = [get_embedding_chunk, " + ", ".join(f"c{i}" for i in range(lines)) + "]", ""]
    return "\n".join(text).encode()


def run(path: Path, cap: float) -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", RUNNER, str(path)], capture_output=True, text=True,
                              timeout=cap, check=True)
    except subprocess.TimeoutExpired:
        return {"wall": None}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[100, 400, 1600])
    parser.add_argument("--cap", type=float, default=300.0, help="seconds per run before it counts as capped")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    names = subprocess.run([sys.executable, "-c", MOVED_NAMES], capture_output=True, text=True,
                           check=True).stdout.split()
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-codemod-imports-") as tmp:
        for n in args.lines:
            path = Path(tmp) / f"many_{n}.py"
            path.write_bytes(generate(n, names))
            rows.append((n, path.stat().st_size, run(path, args.cap)))
    lines = [
        SECTION,
        "",
        f"Produced by `python benchmarks/bench_codemod_imports.py --lines {' '.join(map(str, args.lines))} "
        f"--cap {args.cap:.0f}`: a module of N statements `from sglang.srt.managers.mm_utils import <moved name> as cI`"
        f" after one import of `mm_schedule` (all of them merge into it), migrated in a fresh subprocess (Python "
        f"{platform.python_version()}, libcst {version('libcst')}, {os.cpu_count()} shared CPUs, 1-minute load "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after).",
        "",
        "| lines | bytes | wall s | CPU s | ms per line | peak MB | rewritten |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n, n_bytes, r in rows:
        if r.get("wall") is None:
            lines.append(f"| {n} | {n_bytes} | > {args.cap:.0f} (capped) | - | - | - | - |")
        else:
            lines.append(f"| {n} | {n_bytes} | {r['wall']:.2f} | {r['cpu']:.2f} | {1e3 * r['wall'] / n:.2f} "
                         f"| {r['rss_mb']:.0f} | {'yes' if r['changed'] else 'NO'} |")
    section = "\n".join(lines) + "\n"
    print(section)
    replace_section(args.out, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
