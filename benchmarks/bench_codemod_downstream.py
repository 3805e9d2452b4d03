"""The codemod over public downstream repositories: files, changes, findings, time, and
whether every rewrite resolves against the release it targets.

Each repository is given as ``NAME=GIT_DIR`` (a local clone or bare mirror); its ``HEAD``
is exported with ``git archive`` into a temporary folder (nothing of it is kept), then:

1. a static check (``tests/codemods/realworld_check.py``, stdlib ``ast`` only) lists every
   reference into ``mm_utils``/``mm_schedule`` that SGLang 0.5.18 no longer binds;
2. ``mm-schedule-codemod PATH --write --json`` runs once, timed, as a subprocess;
3. the check runs again: what still does not resolve must be a line the codemod flagged
   for a person; every changed file must parse;
4. a second ``--write`` must change nothing (idempotence);
5. ``fork_warnings`` lists trees that carry the old module's own file, and whether the run
   raised MMS015 for it or the tree settled it (its own new module binds every target).

    python benchmarks/bench_codemod_downstream.py NAME=GIT_DIR [...] [--jobs 2]

The table replaces the "Downstream repositories" section of ``benchmarks/results/codemod.md``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

from _results_file import replace_section

from mm_schedule.codemods.movemap.schema import load_map
from mm_schedule.codemods.rules.fork import fork_warnings

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "codemod.md"
SECTION = "## Downstream repositories"


def _checker():
    path = HERE.parent / "tests" / "codemods" / "realworld_check.py"
    spec = importlib.util.spec_from_file_location("mm_codemod_realworld_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def export(git_dir: str, dest: Path) -> str:
    """``HEAD`` of ``git_dir`` under ``dest``; returns the commit."""
    commit = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "--git-dir", git_dir, "archive", "--format=tar", commit, "--", "*.py"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return commit


def run_codemod(root: Path, report: Path, jobs: int) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mm_schedule.codemods", str(root), "--write", "--json",
                           str(report), "-j", str(jobs)], capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode


def study(name: str, git_dir: str, jobs: int, rw, bindings) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"downstream-{name}-") as tmp:
        root = Path(tmp) / name
        commit = export(git_dir, root)
        files = list(rw.python_files(root))
        mentioning = [p for p in files if b"mm_utils" in p.read_bytes()]
        before, _ = rw.unresolved_in_tree(root, bindings)
        digest0 = rw.tree_digest(root)
        wall, rc = run_codemod(root, Path(tmp) / "first.json", jobs)
        report = json.loads((Path(tmp) / "first.json").read_text())
        digest1 = rw.tree_digest(root)
        changed = sorted(p for p in digest1 if digest0.get(p) != digest1[p])
        unparsable = []
        for rel in changed:
            try:
                ast.parse((root / rel).read_bytes())
            except SyntaxError:
                unparsable.append(rel)
        after, _ = rw.unresolved_in_tree(root, bindings)
        findings = report["findings"]
        flagged = {(Path(f["path"]).resolve().relative_to(root.resolve()).as_posix(), f["line"])
                   for f in findings if not f["fixed"]}
        unexplained = [u for u in after if (u.path, u.line) not in flagged]
        wall2, _ = run_codemod(root, Path(tmp) / "second.json", jobs)
        second = json.loads((Path(tmp) / "second.json").read_text())
        idempotent = rw.tree_digest(root) == digest1 and not any(f["fixed"] for f in second["findings"])
        forks = fork_warnings([p.relative_to(root).as_posix() for p in files], load_map())
        raised = {Path(f["path"]).resolve().relative_to(root.resolve()).as_posix()
                  for f in findings if f["code"] == "MMS015"}
    return {
        "name": name, "commit": commit[:10], "files": len(files), "mentioning": len(mentioning),
        "before": len(before), "after": len(after), "unexplained": unexplained, "changed": len(changed),
        "fixed": sum(f["fixed"] for f in findings), "manual": sum(not f["fixed"] for f in findings),
        "codes": Counter(f["code"] for f in findings), "wall": wall, "wall2": wall2, "rc": rc,
        "unparsable": unparsable, "idempotent": idempotent,
        "forks": [w.path + ("" if w.path in raised else " (settled)") for w in forks],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", nargs="+", metavar="NAME=GIT_DIR")
    parser.add_argument("--jobs", "-j", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rw = _checker()
    bindings = rw.release_bindings(rw.sglang_wheel("0.5.18"))
    load = os.getloadavg()[0]
    rows = [study(*spec.split("=", 1), args.jobs, rw, bindings) for spec in args.repos]
    lines = [
        SECTION,
        "",
        f"Produced by `python benchmarks/bench_codemod_downstream.py {' '.join(r['name'] + '=...' for r in rows)} "
        f"-j {args.jobs}` over the `HEAD` of each public repository (exported with `git archive`, run in a "
        f"temporary folder, nothing kept). Python {platform.python_version()}, libcst {version('libcst')}, "
        f"{os.cpu_count()} shared CPUs (1-minute load {load:.1f} at the start). \"unresolved\": references into "
        "`mm_utils`/`mm_schedule` that SGLang 0.5.18 does not bind, by the static check of "
        "`tests/codemods/realworld_check.py`; after the run, every one left must sit on a line the codemod "
        "flagged for a person.",
        "",
        "| repository @ commit | .py files | mention `mm_utils` | unresolved before | changed files | fixed | "
        "need a person | unresolved after (unflagged) | `--write` s | 2nd run s, idempotent | fork warning |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|---|",
    ]
    ok = True
    for r in rows:
        lines.append(
            f"| {r['name']} @ {r['commit']} | {r['files']} | {r['mentioning']} | {r['before']} | {r['changed']} | "
            f"{r['fixed']} | {r['manual']} | {r['after']} ({len(r['unexplained'])}) | {r['wall']:.2f} | "
            f"{r['wall2']:.2f}, {'yes' if r['idempotent'] else 'NO'} | {', '.join(r['forks']) or '-'} |"
        )
        ok = ok and not r["unexplained"] and not r["unparsable"] and r["idempotent"]
    lines.append("")
    for r in rows:
        codes = ", ".join(f"{c} x{n}" for c, n in sorted(r["codes"].items()))
        lines.append(f"- {r['name']}: findings by code: {codes or 'none'}; exit status {r['rc']}"
                     + (f"; changed files that do not parse: {r['unparsable']}" if r["unparsable"] else "")
                     + (f"; unresolved and not flagged: {[str(u) for u in r['unexplained']]}" if r["unexplained"] else ""))
    section = "\n".join(lines) + "\n"
    print(section)
    replace_section(args.out, section)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
