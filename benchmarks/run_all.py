"""Run every benchmark script in this folder (``bench_*.py``), one after another.

    python benchmarks/run_all.py                  # full runs; each script writes its results
    python benchmarks/run_all.py --quick          # --quick to every script that accepts it
    python benchmarks/run_all.py --only schedule  # scripts whose name contains "schedule"

A script "accepts --quick" when its source declares that option. Scripts that do not
run in full even under ``--quick``. Each script's output streams through; a summary
follows, and the exit status is 1 when any script failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover(only: list[str]) -> list[Path]:
    scripts = sorted(HERE.glob("bench_*.py"))
    return [s for s in scripts if not only or any(word in s.name for word in only)]


def accepts_quick(script: Path) -> bool:
    return '"--quick"' in script.read_text(encoding="utf-8", errors="replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to scripts that accept it")
    parser.add_argument("--only", nargs="+", default=[], metavar="WORD", help="run scripts whose file name contains WORD")
    parser.add_argument("--list", action="store_true", help="list the scripts and exit")
    args = parser.parse_args(argv)

    scripts = discover(args.only)
    if not scripts:
        print(f"no benchmark script matches {args.only or 'bench_*.py'} in {HERE}")
        return 1
    if args.list:
        for script in scripts:
            print(f"{script.name}{'  (accepts --quick)' if accepts_quick(script) else ''}")
        return 0

    summary = []
    for script in scripts:
        command = [sys.executable, str(script)] + (["--quick"] if args.quick and accepts_quick(script) else [])
        print(f"\n=== {' '.join([script.name, *command[2:]])} ===", flush=True)
        started = time.perf_counter()
        rc = subprocess.call(command, cwd=HERE.parent)
        summary.append((script.name, rc, time.perf_counter() - started))

    print("\n=== summary ===")
    for name, rc, seconds in summary:
        print(f"{'ok  ' if rc == 0 else 'FAIL'}  {name:<40} {seconds:7.1f} s  (exit {rc})")
    return 0 if all(rc == 0 for _, rc, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
