"""A large generated tree, side by side with ruff: the codemod's CPU time against
``ruff check --select I`` (import sorting: ruff's cheapest whole-tree pass that reads
every import).

The tree has ``--files`` modules in packages of 100; ``--share`` of them (1% by default)
use the old module the way real code does (from-imports of moved and kept names, module
attribute access, a ``mock.patch("...")`` target, a lazy import in a function), the rest
are ordinary modules of the same size that never mention it. Each tool runs as a
subprocess over the whole tree, ``--repeat`` times, alternating; the CPU time is user +
system of the whole process tree (its workers included), read from ``os.wait4``. The
machine may be shared, so every repetition is listed and the ratio is taken of the
medians.

    python benchmarks/bench_codemod_tree.py [--files 20000] [--share 0.01] [--repeat 3]

The table replaces the "Large tree against ruff" section of ``benchmarks/results/codemod.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from _results_file import replace_section

RESULTS = Path(__file__).resolve().parent / "results" / "codemod.md"
SECTION = "## Large tree against ruff"
TARGET_RATIO = 3.0

ORDINARY = '''"""Module {i}: ordinary code that never mentions the old module."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field


@dataclass
class Record{i}:
    name: str
    values: list[float] = field(default_factory=list)

    def total(self) -> float:
        out = 0.0
        for k, value in enumerate(self.values):
            out += value * (k % 3 + 1) if k % 2 else -value
        return out

    def dump(self, folder: str) -> str:
        path = os.path.join(folder, f"{{self.name}}-{i}.json")
        with open(path, "w") as f:
            json.dump({{"name": self.name, "total": self.total()}}, f)
        return path


def load_{i}(folder: str) -> list[Record{i}]:
    out = []
    for entry in sorted(os.listdir(folder)):
        if entry.endswith(".json"):
            with open(os.path.join(folder, entry)) as f:
                data = json.load(f)
            out.append(Record{i}(data["name"], [data["total"]]))
    return out
'''

USER = '''"""Module {i}: uses the old module."""

from __future__ import annotations

from unittest import mock

from sglang.srt.managers import mm_utils
from sglang.srt.managers.mm_utils import (
    MultimodalDataItem,
    general_mm_embed_routine,
    get_embedding_chunk,
)


def embed_{i}(items, positions):
    chunk = get_embedding_chunk(items, positions)
    data = MultimodalDataItem(chunk)
    return mm_utils._get_chunked_prefill_embedding(data), general_mm_embed_routine


def lazy_{i}():
    from sglang.srt.managers.mm_utils import _adjust_embedding_length

    return _adjust_embedding_length


def test_{i}():
    with mock.patch(
        "sglang.srt.managers.mm_utils._get_multimodal_mask"
    ) as patched:
        embed_{i}([], [])
    return patched
'''


def generate(root: Path, files: int, share: float) -> int:
    """The tree under ``root``; returns how many files use the old module."""
    every = max(1, round(1 / share)) if share > 0 else 0
    users = 0
    (root / "pyproject.toml").write_text('[project]\nname = "tree"\n')
    for i in range(files):
        package = root / "app" / f"pkg{i // 100}"
        if i % 100 == 0:
            package.mkdir(parents=True)
            (package / "__init__.py").write_text("")
        uses = every and i % every == every // 2
        users += bool(uses)
        (package / f"mod{i}.py").write_text((USER if uses else ORDINARY).format(i=i))
    return users


def timed(cmd: list[str], cwd: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of the process tree, exit status) of one run."""
    start = time.perf_counter()
    process = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, process.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--share", type=float, default=0.01, help="fraction of files using the old module")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        print("ruff is not installed", file=sys.stderr)
        return 2
    ruff_cmd = [ruff, "check", "--select", "I", "--no-cache", "--exit-zero", "-q", "."]
    ours_cmd = [sys.executable, "-m", "mm_schedule.codemods", "--check", "-q", "-j", str(args.jobs), "."]
    load_before = os.getloadavg()[0]
    runs: dict[str, list[tuple[float, float, int]]] = {"ruff": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="bench-codemod-tree-") as tmp:
        root = Path(tmp)
        users = generate(root, args.files, args.share)
        subprocess.run(ruff_cmd, cwd=root, capture_output=True)  # warm the page cache
        for _ in range(args.repeat):
            runs["ruff"].append(timed(ruff_cmd, root))
            runs["ours"].append(timed(ours_cmd, root))
    load_after = os.getloadavg()[0]
    median = {name: statistics.median(cpu for _, cpu, _ in rows) for name, rows in runs.items()}
    ratio = median["ours"] / median["ruff"]

    def cells(rows):
        return ", ".join(f"{cpu:.2f}" for _, cpu, _ in rows), ", ".join(f"{wall:.2f}" for wall, _, _ in rows)

    lines = [
        SECTION,
        "",
        f"Produced by `python benchmarks/bench_codemod_tree.py --files {args.files} --share {args.share:g} "
        f"--repeat {args.repeat} --jobs {args.jobs}`: a generated tree of {args.files} modules "
        f"({users} use the old module), each tool run {args.repeat} times as a subprocess, alternating "
        f"(Python {platform.python_version()}, libcst {version('libcst')}, ruff {version('ruff')}, "
        f"{os.cpu_count()} shared CPUs, 1-minute load {load_before:.1f} before, {load_after:.1f} after). "
        "CPU s: user + system of the process tree. Target: ours <= "
        f"{TARGET_RATIO:g}x ruff's CPU time.",
        "",
        "| tool | CPU s per run | median CPU s | wall s per run | exit status |",
        "|---|---|---:|---|---|",
    ]
    for name, label in (("ruff", "`ruff check --select I`"),
                        ("ours", f"`mm-schedule-codemod --check -j {args.jobs}`")):
        cpu, wall = cells(runs[name])
        statuses = ", ".join(str(rc) for _, _, rc in runs[name])
        lines.append(f"| {label} | {cpu} | {median[name]:.2f} | {wall} | {statuses} |")
    spread = [cpu for _, cpu, _ in runs["ours"]]
    lines += ["", f"Ratio of the medians, ours / ruff: **{ratio:.2f}x** (ours ranged "
                  f"{min(spread):.2f}-{max(spread):.2f} s over the runs)."]
    section = "\n".join(lines) + "\n"
    print(section)
    replace_section(args.out, section)
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
