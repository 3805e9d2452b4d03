"""Codemod speed on SGLang 0.5.17's whole tree, next to libcst's RenameCommand.

Cases, all in one run on the same machine:

* ours, whole tree, ``--check`` (CI use: reads and analyses everything, writes nothing);
* ours, whole tree, ``--write`` (the migration itself, on a fresh copy);
* ours and libcst's ``RenameCommand`` on the same fixed subset of N files (every k-th file
  of the sorted tree); RenameCommand moves ONE name (ours applies the whole map), has a
  hard time cap, and its subset time is extrapolated to the whole tree.

Every tool runs as a fresh subprocess with ``-j`` jobs, so start-up and pool costs count.
Results go to ``benchmarks/results/codemod.md``.

    python benchmarks/bench_codemod.py [--subset 100] [--jobs 2] [--cap 600] [--quick]
    python benchmarks/bench_codemod.py --large-file [--large-mb 5]

``--large-file`` runs only the large generated file case instead (``bench_codemod_large.py``:
one 5 MB module, segmented pass next to the whole-file pass, wall time and peak memory).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib.metadata import version
from pathlib import Path

from mm_schedule.codemods.movemap import derive, sources

TREE_VERSION = "0.5.17"
RENAMED = "_get_chunked_embedding_full"
RESULTS = Path(__file__).resolve().parent / "results" / "codemod.md"
TARGET_S = 15.0


def setup_tree(wheel: Path, dest: Path) -> tuple[int, int]:
    """Extract the wheel's Python files; returns (files, bytes)."""
    files = size = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".py"):
                zf.extract(info, dest)
                files += 1
                size += info.file_size
    return files, size


def setup_subset(tree: Path, dest: Path, n: int) -> list[Path]:
    """Copy every k-th file of the sorted tree (a fixed, spread-out sample) under ``dest``."""
    files = sorted(tree.rglob("*.py"))
    picked = [files[i * len(files) // n] for i in range(min(n, len(files)))]
    for path in picked:
        target = dest / path.relative_to(tree)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return picked


def setup_mentioning(tree: Path, dest: Path, needle: bytes) -> list[Path]:
    """Copy the files that mention ``needle`` (the ones any pre-filter lets through)."""
    picked = [p for p in sorted(tree.rglob("*.py")) if needle in p.read_bytes()]
    for path in picked:
        target = dest / path.relative_to(tree)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return picked


def _timed(cmd: list[str], cap: float, cwd: Path | None = None) -> tuple[float | None, subprocess.CompletedProcess | None]:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cap, cwd=cwd)
    except subprocess.TimeoutExpired:
        return None, None
    return time.perf_counter() - start, proc


def case_ours(path: Path, mode: str, jobs: int, report: Path, cap: float) -> dict:
    cmd = [sys.executable, "-m", "mm_schedule.codemods", str(path), mode, "--json", str(report), "-j", str(jobs)]
    wall, proc = _timed(cmd, cap)
    out = {"wall": wall, "rc": proc.returncode if proc else None, "report": None}
    if proc is not None and proc.returncode not in (0, 1):
        raise SystemExit(f"our codemod failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    if report.is_file():
        out["report"] = json.loads(report.read_text())
    return out


def case_rename(path: Path, jobs: int, cap: float) -> dict:
    cmd = [
        sys.executable, "-m", "libcst.tool", "codemod", "rename.RenameCommand", "-j", str(jobs),
        "--no-format", "--hide-progress",
        "--old_name", f"{derive.SGLANG_OLD_MODULE}.{RENAMED}",
        "--new_name", f"{derive.SGLANG_NEW_MODULE}.{RENAMED}", str(path),
    ]
    wall, proc = _timed(cmd, cap)
    if proc is not None and proc.returncode != 0:
        raise SystemExit(f"RenameCommand failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall": wall}


def prefilter_counts(report: dict | None, tree: Path) -> tuple[str, str]:
    """(files the tool's text pre-filter skipped, where the number comes from)."""
    for key in ("summary", "stats"):
        stats = (report or {}).get(key)
        if isinstance(stats, dict):
            for name in ("prefiltered", "skipped_prefilter", "prefilter_skipped", "skipped_by_prefilter"):
                if isinstance(stats.get(name), int):
                    return str(stats[name]), f"our report's `{key}.{name}`"
    needle = derive.SGLANG_OLD_MODULE.rsplit(".", 1)[-1].encode()
    total = hits = 0
    for path in tree.rglob("*.py"):
        total += 1
        hits += needle in path.read_bytes()
    return str(total - hits), f"counted by the benchmark: files without the bytes `{needle.decode()}`"


def _fmt(seconds: float | None, cap: float) -> str:
    return f"> {cap:.0f} (capped)" if seconds is None else f"{seconds:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subset", type=int, default=100, help="files in the side-by-side subset")
    parser.add_argument("--jobs", "-j", type=int, default=2)
    parser.add_argument("--cap", type=float, default=600.0, help="hard cap (s) per RenameCommand run")
    parser.add_argument("--wheel-cache", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help=f"results file (default {RESULTS})")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 20-file subset, 120 s cap, no mentioning-files cases; prints only "
                        "(the committed results are left alone unless --out is given)")
    parser.add_argument("--large-file", action="store_true",
                        help="run only the large generated file case (bench_codemod_large.py)")
    parser.add_argument("--large-mb", type=float, default=5.0, help="size of the generated file")
    args = parser.parse_args(argv)
    if args.large_file:
        import bench_codemod_large

        return bench_codemod_large.main(["--mb", str(args.large_mb), "--cap", str(args.cap)]
                                        + (["--out", str(args.out)] if args.out else []))
    if args.quick:
        args.subset, args.cap = min(args.subset, 20), min(args.cap, 120.0)
    elif args.out is None:
        args.out = RESULTS

    wheel = sources.fetch_archive(f"sglang=={TREE_VERSION}", args.wheel_cache)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-codemod-") as tmp:
        tmp = Path(tmp)
        n_files, n_bytes = setup_tree(wheel, tmp / "check")
        setup_tree(wheel, tmp / "write")
        picked = setup_subset(tmp / "check", tmp / "subset-ours", args.subset)
        setup_subset(tmp / "check", tmp / "subset-rename", args.subset)
        needle = derive.SGLANG_OLD_MODULE.rsplit(".", 1)[-1].encode()
        mentioning = [] if args.quick else setup_mentioning(tmp / "check", tmp / "mention-ours", needle)
        if mentioning:
            setup_mentioning(tmp / "check", tmp / "mention-rename", needle)

        check = case_ours(tmp / "check", "--check", args.jobs, tmp / "check.json", args.cap)
        write = case_ours(tmp / "write", "--write", args.jobs, tmp / "write.json", args.cap)
        sub_ours = case_ours(tmp / "subset-ours", "--write", args.jobs, tmp / "subset.json", args.cap)
        sub_rename = case_rename(tmp / "subset-rename", args.jobs, args.cap)
        men_ours = men_rename = {"wall": None}
        if mentioning:
            men_ours = case_ours(tmp / "mention-ours", "--write", args.jobs, tmp / "mention.json", args.cap)
            men_rename = case_rename(tmp / "mention-rename", args.jobs, args.cap)
        skipped, skipped_src = prefilter_counts(check["report"], tmp / "check")
        findings = len((write["report"] or {}).get("findings", []))
        changed = sum(
            (tmp / "write" / p).read_bytes() != (tmp / "check" / p).read_bytes()
            for p in (q.relative_to(tmp / "check") for q in (tmp / "check").rglob("*.py"))
        )

    per_file_rename = None if sub_rename["wall"] is None else sub_rename["wall"] / len(picked)
    lines = [
        "# Codemod speed: SGLang 0.5.17 tree",
        "",
        f"Tree: `sglang=={TREE_VERSION}` wheel, {n_files} Python files, {n_bytes / 1e6:.1f} MB. "
        f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, libcst {version('libcst')}; "
        f"every tool run as a subprocess with `-j {args.jobs}`. Produced by `python benchmarks/bench_codemod.py "
        f"--subset {args.subset} --jobs {args.jobs} --cap {args.cap:.0f}{' --quick' if args.quick else ''}`. 1-minute load average "
        f"{load_before:.1f} before and {os.getloadavg()[0]:.1f} after (the machine is shared; "
        "the ratios, measured in one run, are what to compare).",
        "",
        "| case | files | wall s | files/s | note |",
        "|---|---:|---:|---:|---|",
    ]

    def row(name: str, files: int, wall: float | None, note: str) -> None:
        rate = "-" if wall is None else f"{files / wall:.0f}"
        lines.append(f"| {name} | {files} | {_fmt(wall, args.cap)} | {rate} | {note} |")

    row("ours `--check`, whole tree", n_files, check["wall"], f"exit {check['rc']}; target <= {TARGET_S:.0f} s")
    row("ours `--write`, whole tree", n_files, write["wall"], f"{changed} files changed, {findings} findings")
    sub_matched = ((sub_ours["report"] or {}).get("summary") or {}).get("files_matched", "?")
    row(f"ours `--write`, subset of {len(picked)}", len(picked), sub_ours["wall"],
        f"whole map (all moved names); {sub_matched} of them pass the pre-filter")
    row(f"libcst RenameCommand, subset of {len(picked)}", len(picked), sub_rename["wall"], f"one name (`{RENAMED}`)")
    if mentioning:
        row(f"ours `--write`, the {len(mentioning)} files mentioning `{needle.decode()}`", len(mentioning),
            men_ours["wall"], "every file parsed or ast-gated")
        row(f"libcst RenameCommand, the same {len(mentioning)} files", len(mentioning), men_rename["wall"], "one name")
    if per_file_rename is not None:
        extrapolated = per_file_rename * n_files
        lines.append(f"| libcst RenameCommand, whole tree (extrapolated) | {n_files} | {extrapolated:.0f} | "
                     f"{n_files / extrapolated:.1f} | {per_file_rename * 1000:.0f} ms/file x {n_files} files |")
    lines.append("")
    lines.append(f"Files the text pre-filter skipped (never parsed): {skipped} of {n_files} ({skipped_src}).")
    if check["wall"] and per_file_rename is not None:
        lines.append("")
        lines.append(
            f"Ratio, whole tree: RenameCommand (extrapolated, one name) / ours `--check` (whole map) = "
            f"{per_file_rename * n_files / check['wall']:.0f}x. Same subset: "
            f"{sub_rename['wall'] / sub_ours['wall']:.1f}x."
        )
    if men_ours["wall"] and men_rename["wall"]:
        lines.append(
            f"Files that mention `{needle.decode()}` (no pre-filter advantage): RenameCommand / ours = "
            f"{men_rename['wall'] / men_ours['wall']:.1f}x."
        )
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        # keep the sections other scripts write (large file, downstream repositories)
        old = args.out.read_text() if args.out.exists() else ""
        others = old[old.find("\n## ") + 1:] if "\n## " in old else ""
        args.out.write_text(text + ("\n" + others if others else ""))
    print(text)
    return 0 if check["wall"] is not None and check["wall"] <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
