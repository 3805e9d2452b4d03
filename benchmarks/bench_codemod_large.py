"""One large generated file through the codemod: wall time and peak memory.

Three 5 MB modules are generated: a *sparse* one, where one top-level statement in
twenty uses the old module (how real modules look: a few call sites in a lot of other
code), a *dense* one, where every function does, and a *local imports* one, where every
function imports the old module itself (the lazy imports common in SGLang code) and
uses what it imported. Each is migrated in a
fresh subprocess by ``migrate_source`` as the CLI calls it (segmented: statements that
mention none of the map's names are left out, those whose uses are all simple shapes are
planned once per distinct use, functions importing the old module once per distinct
pattern of imports and uses, and only the rest is parsed by libcst) and, side by side,
by the whole-file pass (``segment_above`` set past the file size: what every file got
before). Wall time, CPU time and peak RSS come from the subprocess itself; outputs and
findings are compared.

    python benchmarks/bench_codemod_large.py [--mb 5] [--cap 400]

The table replaces the "Large generated file" section of ``benchmarks/results/codemod.md``.
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
SECTION = "## Large generated file"
TARGET_S, TARGET_MB = 10.0, 1024

HEADER = (
    '"""Generated module."""\nimport os\nimport unittest.mock as mock\n\n'
    "from sglang.srt.managers import mm_utils\n"
    "from sglang.srt.managers.mm_utils import MultimodalDataItem, embedding_cache, get_embedding_chunk\n"
)
USES = '''

def use_{i}(x, y):
    a = mm_utils.get_embedding_chunk(x, y) + get_embedding_chunk(y, x)
    with mock.patch("sglang.srt.managers.mm_utils._adjust_embedding_length"):
        c = MultimodalDataItem(a, embedding_cache)
    return a, c
'''
LOCAL = '''

def lazy_{i}(x, y):
    from sglang.srt.managers.mm_utils import get_embedding_chunk, MultimodalDataItem
    import sglang.srt.managers.mm_utils as mmu
    a = get_embedding_chunk(x, y) + mmu.get_embedding_chunk(y, x)
    for k in range({r}):
        a += os.path.getsize(str(k)) if k % 2 else k * {i}
    return MultimodalDataItem(a, mmu._is_hip), {{"name": "lazy {i}", "scale": [x, y, {r}]}}
'''
OTHER = '''

class Thing{i}:
    """An ordinary class."""

    def __init__(self, value, *, scale=2.0):
        self.value = value
        self.scale = scale

    def total(self, items):
        out = 0
        for k, item in enumerate(items):
            if k % 3 == {r}:
                out += item * self.scale
            else:
                out -= os.path.getsize(str(item)) if isinstance(item, str) else item
        return {{"total": out, "name": "thing {i}", "parts": [self.value, self.scale]}}
'''

# Runs in the subprocess: migrate one file, print wall time, peak RSS and a digest.
RUNNER = """
import hashlib, json, resource, sys, time
from mm_schedule.codemods.movemap.schema import load_map
from mm_schedule.codemods.engine.transform import migrate_source
source = open(sys.argv[1], "rb").read()
move_map = load_map()
start, cpu = time.perf_counter(), time.process_time()
outcome = migrate_source(source, move_map, path="big.py", package="app", segment_above=int(sys.argv[2]))
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "digest": hashlib.sha256(outcome.new_source or b"").hexdigest(),
                  "findings_digest": hashlib.sha256(repr(outcome.findings).encode()).hexdigest(),
                  "findings": len(outcome.findings)}))
"""


def generate(size: int, every: int, uses: str = USES) -> bytes:
    """A module of about ``size`` bytes; every ``every``-th statement is ``uses``."""
    parts, total, i = [HEADER], len(HEADER), 0
    while total < size:
        text = (uses if i % every == 0 else OTHER).format(i=i, r=i % 5)
        parts.append(text)
        total += len(text)
        i += 1
    return "".join(parts).encode()


def run(path: Path, segment_above: int, cap: float) -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", RUNNER, str(path), str(segment_above)],
                              capture_output=True, text=True, timeout=cap, check=True)
    except subprocess.TimeoutExpired:
        return {"wall": None}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=5.0)
    parser.add_argument("--cap", type=float, default=400.0, help="seconds per run before it counts as capped")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    size = int(args.mb * 1_000_000)
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-codemod-large-") as tmp:
        for k, (name, every, uses) in enumerate((
            ("sparse (1 statement in 20 uses the old module)", 20, USES),
            ("dense (every function does)", 1, USES),
            ("local imports (every function imports the old module itself)", 1, LOCAL),
        )):
            path = Path(tmp) / f"{k}.py"
            path.write_bytes(generate(size, every, uses))
            seg = run(path, 0, args.cap)
            whole = run(path, 1 << 62, args.cap)
            rows.append((name, path.stat().st_size, seg, whole))
    lines = [
        SECTION,
        "",
        f"Produced by `python benchmarks/bench_codemod_large.py --mb {args.mb:g} --cap {args.cap:.0f}`: "
        f"generated modules of {args.mb:g} MB, each migrated in a fresh subprocess (Python "
        f"{platform.python_version()}, libcst {version('libcst')}, {os.cpu_count()} shared CPUs, 1-minute load "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after). \"whole file\" is the pass every file got "
        f"before segmenting. Target: <= {TARGET_S:.0f} s and <= {TARGET_MB} MB.",
        "",
        "| file | bytes | segmented s | segmented CPU s | segmented peak MB | whole file s | whole file peak MB "
        "| same output and findings | findings |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    ok = True
    for name, n_bytes, seg, whole in rows:
        def cell(r, key, fmt):
            return f"> {args.cap:.0f} (capped)" if r.get("wall") is None else format(r[key], fmt)
        same = "-" if None in (seg.get("wall"), whole.get("wall")) else (
            "yes" if (seg["digest"], seg["findings_digest"]) == (whole["digest"], whole["findings_digest"]) else "NO")
        lines.append(f"| {name} | {n_bytes} | {cell(seg, 'wall', '.2f')} | {cell(seg, 'cpu', '.2f')} | {cell(seg, 'rss_mb', '.0f')} | "
                     f"{cell(whole, 'wall', '.2f')} | {cell(whole, 'rss_mb', '.0f')} | {same} | {seg.get('findings', '-')} |")
        ok = ok and seg.get("wall") is not None and seg["wall"] <= TARGET_S and seg["rss_mb"] <= TARGET_MB
    section = "\n".join(lines) + "\n"
    print(section)
    replace_section(args.out, section)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
