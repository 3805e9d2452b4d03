"""``mm-schedule-codemod``: migrate code across a module split (and ``derive`` a map).

Exit status: 0 nothing left to do; 1 changes or findings remain (``--check``,
``--diff``) or findings that need a person remain (``--write``); 2 some files could
not be parsed or written (they are listed; every other file is still processed).
"""

from __future__ import annotations

import argparse
import difflib
import io
import json
import multiprocessing
import os
import sys
import tempfile
import time
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from .files import discover
from .findings import RULES, Finding
from .move_map import MoveMap, load_map
from .relevance import Gate
from .resolve import package_for
from .transform import migrate_source

_CHUNK = 4


@dataclass
class FileReport:
    path: Path
    old: bytes | None = None  # set only when the file changes
    new: bytes | None = None
    encoding: str = "utf-8"
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None


# --- worker side -----------------------------------------------------------------------
_WORKER: dict = {}


def _init_worker(move_map: MoveMap) -> None:
    _WORKER["map"] = move_map
    _WORKER["gate"] = Gate.for_map(move_map)


def _process(item: tuple[str, str, str]) -> FileReport:
    path_str, root, shown = item
    path = Path(path_str)
    report = FileReport(path=path)
    try:
        source = path.read_bytes()
    except OSError as exc:
        report.error = f"cannot read: {exc.strerror or exc}"
        return report
    gate: Gate = _WORKER["gate"]
    if not gate.mentions(source):
        return report
    try:
        outcome = migrate_source(
            source, _WORKER["map"], path=shown, package=package_for(path, root), gate=gate
        )
    except cst.ParserSyntaxError as exc:
        report.error = f"cannot parse: line {exc.raw_line}, column {exc.raw_column}: {exc.message}"
        return report
    except (UnicodeDecodeError, SyntaxError) as exc:
        report.error = f"cannot parse: {exc}"
        return report
    except Exception as exc:  # a bug of ours must not stop the run over other files
        report.error = f"internal error ({type(exc).__name__}: {exc}); file left as is"
        return report
    report.findings = outcome.findings
    if outcome.new_source is not None:
        report.old, report.new = source, outcome.new_source
        report.encoding = _encoding_of(source)
    return report


def _encoding_of(source: bytes) -> str:
    """The encoding Python reads ``source`` with (coding cookie or BOM, else UTF-8)."""
    try:
        return tokenize.detect_encoding(io.BytesIO(source).readline)[0]
    except SyntaxError:
        return "utf-8"


# --- parent side -----------------------------------------------------------------------
def _shown(path: Path) -> str:
    """Path as printed and as used in diffs: relative to the working folder if inside it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


class _Progress:
    def __init__(self, total: int) -> None:
        self.total = total
        self.enabled = sys.stderr.isatty() and total >= 50
        self.last = 0.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done != self.total and now - self.last < 0.1:
            return
        self.last = now
        width = 30
        filled = width * done // max(self.total, 1)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} files")
        if done == self.total:
            sys.stderr.write("\r\033[2K")
        sys.stderr.flush()


def _run(items: list[tuple[str, str, str]], move_map: MoveMap, jobs: int):
    progress = _Progress(len(items))
    if jobs <= 1 or len(items) <= _CHUNK * 2:
        _init_worker(move_map)
        for done, item in enumerate(items, 1):
            yield _process(item)
            progress.update(done)
        return
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with context.Pool(jobs, initializer=_init_worker, initargs=(move_map,)) as pool:
        for done, report in enumerate(pool.imap_unordered(_process, items, chunksize=_CHUNK), 1):
            yield report
            progress.update(done)


def unified_diff(old: str, new: str, shown: str) -> str:
    """A patch ``git apply`` accepts (a/ b/ prefixes, explicit no-newline markers)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(a, b, f"a/{shown}", f"b/{shown}"):
        if line.startswith(("---", "+++")):
            out.append(line.rstrip("\n") + "\n")
        elif line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` so that a crash at any point leaves either the old
    or the new file, never a mix: temp file in the same folder, fsync, os.replace."""
    mode = path.stat().st_mode & 0o7777
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".mmtmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable where the platform allows it
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mm-schedule-codemod",
        description=(
            "Migrate code across a module split (default: SGLang's "
            "sglang.srt.managers.mm_utils -> mm_schedule). "
            "'mm-schedule-codemod derive --help' builds a move map from two source versions."
        ),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or folders to process")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", dest="mode", action="store_const", const="check",
                      help="write nothing; exit 1 if changes or findings remain (default)")
    mode.add_argument("--diff", dest="mode", action="store_const", const="diff",
                      help="print a unified diff (git apply accepts it); exit as --check")
    mode.add_argument("--write", dest="mode", action="store_const", const="write",
                      help="apply the changes in place, atomically per file")
    parser.add_argument("--json", metavar="FILE", help="write a JSON report ('-' for stdout)")
    parser.add_argument("--map", metavar="FILE", help="move map JSON (default: the shipped SGLang map)")
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="worker processes (default: CPU count)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    parser.set_defaults(mode="check")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "derive":
        from .derive import main as derive_main

        return derive_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        move_map = load_map(args.map)
    except (OSError, ValueError) as exc:
        print(f"mm-schedule-codemod: cannot load move map {args.map}: {exc}", file=sys.stderr)
        return 2
    try:
        files = _gather(args.paths)
    except FileNotFoundError as exc:
        print(f"mm-schedule-codemod: {exc}", file=sys.stderr)
        return 2
    jobs = args.jobs if args.jobs and args.jobs > 0 else (os.cpu_count() or 1)
    gate = Gate.for_map(move_map)
    # The bytes gate runs here: most files never reach a worker.
    candidates = []
    for path, root in files:
        try:
            if gate.mentions(path.read_bytes()):
                candidates.append((str(path), root, _shown(path)))
        except OSError:
            candidates.append((str(path), root, _shown(path)))

    reports = sorted(_run(candidates, move_map, jobs), key=lambda r: _shown(r.path))
    out = sys.stdout
    failed = [r for r in reports if r.error]
    changed = [r for r in reports if r.new is not None]
    findings = [f for r in reports for f in r.findings]
    write_errors: list[tuple[FileReport, str]] = []
    if args.mode == "write":
        for report in changed:
            try:
                write_atomically(report.path, report.new)
            except OSError as exc:
                write_errors.append((report, f"cannot write: {exc.strerror or exc}"))
    if args.mode == "diff":
        for report in changed:
            out.write(unified_diff(report.old.decode(report.encoding, "surrogateescape"),
                                   report.new.decode(report.encoding, "surrogateescape"),
                                   _shown(report.path)))
    report_stream = sys.stderr if args.mode == "diff" else out
    if not args.quiet:
        for finding in sorted(findings, key=lambda f: (f.path, f.line, f.column)):
            report_stream.write(_render(finding, args.mode) + "\n")
    for report in failed:
        print(f"{_shown(report.path)}: skipped, {report.error}", file=sys.stderr)
    for report, error in write_errors:
        print(f"{_shown(report.path)}: {error}", file=sys.stderr)
    manual = [f for f in findings if not f.fixed]
    summary = {
        "files_scanned": len(files),
        "files_matched": len(candidates),
        "prefiltered": len(files) - len(candidates),
        "files_changed": len(changed) - len(write_errors),
        "files_failed": len(failed) + len(write_errors),
        "findings": len(findings),
        "fixed": len(findings) - len(manual),
        "manual": len(manual),
        "by_code": dict(sorted(Counter(f.code for f in findings).items())),
    }
    verb = {"write": "changed", "check": "would change", "diff": "would change"}[args.mode]
    print(
        f"{summary['files_scanned']} files scanned, {summary['files_changed']} {verb}, "
        f"{len(findings)} findings ({summary['fixed']} fixable, {len(manual)} need a person)"
        + (f", {summary['files_failed']} failed" if summary["files_failed"] else ""),
        file=sys.stderr,
    )
    if args.json:
        _write_json(args.json, args, move_map, summary, reports, findings, write_errors)
    if failed or write_errors:
        return 2
    if args.mode == "write":
        return 1 if manual else 0
    return 1 if changed or findings else 0


def _render(finding: Finding, mode: str) -> str:
    if finding.fixed:
        mark = "fixed" if mode == "write" else "fixable"
    else:
        mark = "manual"
    return f"{finding.path}:{finding.line}:{finding.column}: {finding.code} [{mark}] {finding.message}"


def _gather(paths: list[str]) -> list[tuple[Path, str]]:
    out = []
    cwd = str(Path.cwd())
    for raw in paths:
        root = raw if Path(raw).is_dir() else cwd
        for path in discover([raw]):
            out.append((path, root))
    seen: set[Path] = set()
    unique = []
    for path, root in out:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append((path, root))
    return unique


def _write_json(target, args, move_map, summary, reports, findings, write_errors) -> None:
    document = {
        "tool": "mm-schedule-codemod",
        "schema_version": 1,
        "mode": args.mode,
        "map": {
            "old_module": move_map.old_module,
            "new_module": move_map.new_module,
            "source": args.map or "builtin",
        },
        "rules": {code: {"name": name, "summary": text} for code, (name, text) in RULES.items()},
        "summary": summary,
        "changed_files": [_shown(r.path) for r in reports if r.new is not None],
        "failed_files": [{"path": _shown(r.path), "error": r.error} for r in reports if r.error]
        + [{"path": _shown(r.path), "error": e} for r, e in write_errors],
        "findings": [f.to_dict() for f in sorted(findings, key=lambda f: (f.path, f.line, f.column))],
    }
    text = json.dumps(document, indent=2) + "\n"
    if target == "-":
        sys.stdout.write(text)
    else:
        Path(target).write_text(text, encoding="utf-8")
