"""One run of the codemod over a tree, in the order data flows:

validate the inputs → discover the files → read them (the bytes gate) → migrate each in a
worker process (and, with ``--write``, write it as it comes back) → report.
"""

from __future__ import annotations

import io
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import libcst as cst

from ..errors import MoveMapError
from . import rules as rule_table
from .engine.fidelity import at_risk, keep_untouched_lines
from .engine.notebooks import NotebookError, migrate_notebook
from .engine.resolve import package_for
from .engine.transform import migrate_source
from .engine.workers import Outcome, Task, WorkerPool
from .fastpath.gate import Gate
from .movemap.schema import MoveMap, load_map
from .report.exit_status import EXIT_FAILED, EXIT_OK, EXIT_REMAINING, UsageError
from .report.failures import Failure, os_reason, syntax_error_message
from .report.formats import DOCUMENTS, finding_lines, github_failure_lines, sarif
from .report.run_report import FileResult, RunReport, printable
from .report.selection import Layer, Selection, SelectionError, resolve
from .report.suppression import UNUSED
from .report.suppression import mentioned as suppression_mentioned
from .rules.fork import fork_files, fork_warnings, settle, spare
from .workspace.config import Config, ConfigError, find_config
from .workspace.diffs import patch_path, unified_diff
from .workspace.discovery import Discovery, discover, excluded_stdin, shown
from .workspace.writing import (
    FileChanged,
    Snapshot,
    TempGuard,
    read_snapshot,
    replace,
    unwritable_reason,
)

STDIN = "-"  # the path that stands for standard input
_RETRIES = 1  # times a file edited during the run is read and migrated again


def _validate(args) -> tuple[MoveMap, str | None]:
    """Everything that can be wrong before a file is read; raises UsageError."""
    try:
        os.getcwd()
    except FileNotFoundError as exc:
        raise UsageError("the current folder no longer exists") from exc
    if "" in args.paths:
        raise UsageError("empty path argument (use '.' for the current folder)")
    if args.json == "-" and args.mode == "diff":
        raise UsageError("--json - and --diff both write to stdout; give --json a file")
    if args.output_format in DOCUMENTS:
        if args.mode == "diff":
            raise UsageError(f"--output-format {args.output_format} and --diff both write to "
                             "stdout; use --json FILE for the report")
        if args.json == "-":
            raise UsageError(f"--output-format {args.output_format} and --json - both write "
                             "to stdout; give --json a file")
        if args.paths == [STDIN] and args.mode == "write":
            raise UsageError(f"--output-format {args.output_format} and --write - both write "
                             "to stdout; use --json FILE for the report")
    if STDIN in args.paths and len(args.paths) > 1:
        raise UsageError("'-' (standard input) cannot be combined with other paths")
    if args.stdin_filename is not None and args.paths != [STDIN]:
        raise UsageError("--stdin-filename names the source read from '-'; pass '-' as the path")
    if args.stdin_filename == "":
        raise UsageError("empty --stdin-filename")
    if args.paths == [STDIN] and args.json == "-" and args.mode == "write":
        raise UsageError("--json - and --write - both write to stdout; give --json a file")
    if args.json and args.json != "-":
        reason = unwritable_reason(args.json)
        if reason:
            raise UsageError(f"--json {args.json}: {reason}")
    try:
        config = find_config(Path(args.stdin_filename) if args.stdin_filename else Path.cwd())
        selection = _selection(args, config)
        args.selected, args.lenient = selection.codes, selection.lenient
        map_path = args.map or config.map
        return load_map(map_path, target_version=args.target_version), map_path
    except (MoveMapError, ConfigError, SelectionError) as exc:
        raise UsageError(str(exc)) from exc


def _selection(args, config: Config) -> Selection:
    """The codes the run acts on: the settings' selection, then the command line's."""
    layers = [Layer(config.select, config.extend_select, config.ignore,
                    source=str(config.source) if config.source else "settings"),
              Layer(args.select, args.extend_select + ([UNUSED] if args.report_unused_suppressions
                                                       else []), args.ignore,
                    source="command line")]
    return resolve(layers, rule_table.CODES, rule_table.OFF_BY_DEFAULT, rule_table.OPTIONAL)


def _make_transform(move_map: MoveMap, selected: frozenset[str] = rule_table.DEFAULT_SELECTION):
    """The function each worker applies (built in the worker, never pickled)."""
    gate = Gate.for_map(move_map)
    report_unused = UNUSED in selected

    def transform(task: Task) -> Outcome:
        try:
            if task.notebook:
                done = migrate_notebook(task.source, move_map, path=task.shown,
                                        package=task.package, gate=gate,
                                        report_unused_suppressions=report_unused,
                                        selected=selected)
                note = Failure.of("notebook-not-written", done.note) if done.note else None
                return Outcome(done.new_source, done.findings, done.cells, note)
            done = migrate_source(task.source, move_map, path=task.shown,
                                  package=task.package, gate=gate, selected=selected)
            new_source = done.new_source
            if new_source is not None and at_risk(task.source):
                new_source = keep_untouched_lines(task.source, new_source)
            return Outcome(new_source, done.findings)
        except (cst.ParserSyntaxError, SyntaxError) as exc:
            if task.notebook:
                return Outcome(error=Failure.of("syntax-error", f"cannot parse: {exc}; file left as is"))
            return Outcome(error=Failure.of(
                "syntax-error", f"{syntax_error_message(task.source, exc)}; file left as is"))
        except (UnicodeDecodeError, NotebookError) as exc:
            return Outcome(error=Failure.of("syntax-error", f"cannot parse: {exc}; file left as is"))

    return transform


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


@dataclass
class _File:
    """One file on its way through the run."""

    result: FileResult
    snapshot: Snapshot  # the content being migrated
    package: str | None
    notebook: bool
    retries: int = 0

    def task(self, key: int) -> Task:
        return Task(key, self.result.shown, self.package, self.snapshot.data, self.notebook)

    def take(self, outcome: Outcome) -> None:
        result = self.result
        result.findings, result.cells, result.error = outcome.findings, outcome.cells, outcome.error
        result.old, result.new = (None, None) if outcome.new_source is None else (
            self.snapshot.data, outcome.new_source)


def run(args) -> int:
    """One run over the parsed command line: discover, read, migrate (and write), report."""
    move_map, map_path = _validate(args)
    if args.paths == [STDIN]:
        return _run_stdin(args, move_map, map_path)
    found = _discover(args)
    files, problems = _read(args, found, Gate.for_map(move_map))
    own = fork_files([item.real for item in found.files], [f.snapshot.path for f in files], move_map)
    forks = fork_warnings([shown(path) for path in own], move_map)
    move_map = spare(move_map, own)
    _migrate(args, move_map, files)
    by_path = {f.result.shown: f.result for f in files}
    forks = _fork_notices(forks, move_map, files, args.selected)
    for notice in forks:
        if notice.shown in by_path:
            by_path[notice.shown].findings[:0] = notice.findings
        else:
            by_path[notice.shown] = notice
    results = sorted(by_path.values(), key=lambda r: r.shown)
    report = RunReport(args.mode, _map_section(move_map, map_path), results,
                       len(found.files), len(files), problems, found.skipped,
                       optional=args.lenient)
    return _finish(args, report)


def _map_section(move_map: MoveMap, map_path: str | None) -> dict:
    """The report's account of the map: which one, and the release the run aimed it at."""
    return {"old_module": move_map.old_module, "new_module": move_map.new_module,
            "source": map_path or "builtin", "target_version": move_map.aimed_at}


def _run_stdin(args, move_map: MoveMap, map_path: str | None) -> int:
    """``-``: one file's source from stdin, for editors and pre-commit (ruff's
    convention). ``--stdin-filename`` names it for the package, the settings and the
    messages. With ``--write`` the result (the source itself when nothing changes or it
    cannot be migrated) goes to stdout and the findings to stderr; nothing is written."""
    data = sys.stdin.buffer.read()
    name = args.stdin_filename or STDIN
    path = Path(name)
    result = FileResult(name)
    files: list[_File] = []
    if args.stdin_filename:
        pattern = excluded_stdin(path, find_config(path), exclude=args.exclude,
                                 extend_exclude=args.extend_exclude,
                                 force_exclude=args.force_exclude,
                                 respect_gitignore=args.respect_gitignore)
        if pattern and args.verbose:
            print(printable(f"{name}: skipped, matches exclude pattern {pattern!r} "
                            "(force-exclude)"), file=sys.stderr)
    else:
        pattern = None
    notices: list[FileResult] = []
    if not pattern:
        package = package_for(path, Path.cwd()) if args.stdin_filename else None
        own = fork_files([], [path], move_map) if args.stdin_filename else []
        forks = fork_warnings([shown(p) for p in own], move_map)
        move_map = spare(move_map, own)
        files.append(_File(result, Snapshot(path, data, 0, 0), package, path.suffix == ".ipynb"))
        _migrate(args, move_map, files, write=False)
        result.written = args.mode == "write" and result.changes and not result.error
        notices = _fork_notices(forks, move_map, files, args.selected)
    report = RunReport(args.mode, _map_section(move_map, map_path), [result, *notices], 1,
                       len(files), [], [], optional=args.lenient)
    output = (result.new if result.written else data) if args.mode == "write" else None
    return _finish(args, report, stdout_source=output)


def _discover(args) -> Discovery:
    configs: dict[Path, Config] = {}

    def config_for(path: Path) -> Config:
        key = path.absolute()
        if key not in configs:
            configs[key] = find_config(key)
            if args.verbose and configs[key].source is not None:
                print(printable(f"{path}: settings from {configs[key].source}"), file=sys.stderr)
        return configs[key]

    try:
        found = discover(args.paths, config_for, exclude=args.exclude,
                         extend_exclude=args.extend_exclude, force_exclude=args.force_exclude,
                         respect_gitignore=args.respect_gitignore)
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    if args.verbose:
        for path, reason in found.skipped:
            print(printable(f"{path}: skipped, {reason}"), file=sys.stderr)
    return found


def _read(args, found: Discovery, gate: Gate) -> tuple[list[_File], list[tuple[str, str]]]:
    """Snapshots of the files that mention the old module (the bytes gate runs here: most
    files never reach a worker), and the problems met so far."""
    files, problems = [], list(found.problems)
    for item in found.files:
        name = shown(item.real)
        if args.verbose and item.path.absolute() != item.real:
            print(printable(f"{item.path}: symlink, its target {name} is processed"),
                  file=sys.stderr)
        try:
            snapshot = read_snapshot(item.real)
        except OSError as exc:
            problems.append((name, Failure.of("unreadable", f"cannot read: {os_reason(exc)}")))
            continue
        if gate.mentions(snapshot.data) or (UNUSED in args.selected
                                            and suppression_mentioned(snapshot.data)):
            files.append(_File(FileResult(name), snapshot, package_for(item.real, item.root),
                               item.real.suffix == ".ipynb"))
    return files, problems


def _fork_notices(warnings, move_map: MoveMap, files: list[_File],
                  selected: frozenset[str] = rule_table.DEFAULT_SELECTION) -> list[FileResult]:
    """The old module's own file in the tree (a fork), unless settled: said on stderr and
    reported as a finding."""
    if not warnings:
        return []
    notices = []
    findings = [f for file in files for f in file.result.findings]
    for finding in settle(warnings, move_map, findings, _acknowledged):
        if finding.code not in selected:
            continue
        print(printable(f"warning: {finding.path}: {finding.message}"), file=sys.stderr)
        notices.append(FileResult(finding.path, findings=[finding]))
    return notices


def _acknowledged(path: str) -> bool:
    """``acknowledge-fork = true`` in the settings in force for the fork's old module."""
    try:
        return find_config(Path(path)).acknowledge_fork
    except ConfigError:
        return False  # a malformed table stopped the run before anything was read


def _migrate(args, move_map: MoveMap, files: list[_File], write: bool | None = None) -> None:
    """Transform every file in the workers; with --write, write each as it comes back."""
    write = args.mode == "write" if write is None else write
    guard = TempGuard.start() if write and files else None
    jobs = args.jobs or os.cpu_count() or 1
    pool = WorkerPool(min(jobs, max(len(files), 1)), partial(_make_transform, move_map,
                                                           args.selected),
                      timeout=args.timeout, close_fds=(guard.fd,) if guard else ())
    progress = _Progress(len(files))
    try:
        for key, file in enumerate(files):
            pool.submit(file.task(key))
        done = 0
        for task, outcome in pool.results():
            file = files[task.key]
            file.take(outcome)
            if write and file.result.changes and not file.result.error:
                if _write(file, guard):
                    pool.submit(file.task(task.key))
                    continue
            done += 1
            progress.update(done)
    except BaseException:
        pool.close(force=True)
        raise
    finally:
        if guard:
            guard.close()
    pool.close()


def _write(file: _File, guard: TempGuard | None) -> bool:
    """Write one migrated file; True when it changed meanwhile and must be migrated again
    (its snapshot is then the new content)."""
    result = file.result
    try:
        replace(file.snapshot, result.new, guard)
        result.written = True
    except FileChanged:
        if file.retries >= _RETRIES:
            result.error = Failure.of("changed-during-run", "changed again while being "
                                      "migrated; left with its new content (run again)")
            return False
        file.retries += 1
        try:
            file.snapshot = read_snapshot(file.snapshot.path)
        except OSError as exc:
            result.error = Failure.of("unreadable",
                                      f"cannot read after it changed: {os_reason(exc)}")
            return False
        return True
    except FileNotFoundError:  # removed meanwhile: writing would bring it back
        result.error = Failure.of("changed-during-run", "removed while being migrated; "
                                                        "not written")
    except OSError as exc:
        result.error = Failure.of("unwritable", f"cannot write: {os_reason(exc)}; "
                                                "file left as is")
    return False


class _Output:
    """The report's writes to stdout and stderr. A reader that goes away (``| head``)
    ends what is written to that stream, not the run: later writes to it are dropped and
    it is pointed at /dev/null, so that no flush fails at exit. The status still says
    what happened."""

    def __init__(self) -> None:
        self._gone: set[int] = set()

    def write(self, stream, data: str | bytes) -> None:
        if id(stream) in self._gone:
            return
        try:
            if isinstance(data, str):
                _write_text(stream, data)
            elif hasattr(stream, "buffer"):
                stream.flush()
                stream.buffer.write(data)
            else:
                stream.write(data.decode("utf-8", "surrogateescape"))
        except BrokenPipeError:
            self._drop(stream)

    def flush(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            if id(stream) not in self._gone:
                try:
                    stream.flush()
                except BrokenPipeError:
                    self._drop(stream)

    def _drop(self, stream) -> None:
        self._gone.add(id(stream))
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, stream.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, io.UnsupportedOperation):
            pass


def _write_text(stream, text: str) -> None:
    """``text`` on ``stream``; what its encoding cannot show (a name in Chinese on an
    ASCII terminal) comes out as backslash escapes rather than stopping the run."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding))


def _finish(args, report: RunReport, stdout_source: bytes | None = None) -> int:
    """Print and write the report; ``stdout_source``: the migrated source of ``-`` (stdout
    then holds it alone)."""
    json_to_stdout = args.json == "-"
    fmt = args.output_format
    text = sys.stderr if json_to_stdout or args.mode == "diff" or stdout_source is not None else sys.stdout
    out = _Output()
    if args.mode == "diff":
        for result in report.results:
            if result.changes and not result.error:
                out.write(sys.stdout, unified_diff(result.old, result.new,
                                                   patch_path(result.shown)))
    if not args.quiet and fmt not in DOCUMENTS:
        for line in finding_lines(report, fmt):
            out.write(text, line + "\n")
    if fmt == "github":
        for line in github_failure_lines(report):
            out.write(text, line + "\n")
    for line in report.failure_lines():
        out.write(sys.stderr, line + "\n")
    out.write(sys.stderr, report.summary_line() + "\n")
    if stdout_source is not None:
        out.write(sys.stdout, stdout_source)
    if fmt == "json":
        out.write(sys.stdout, report.to_json())
    elif fmt == "sarif":
        out.write(sys.stdout, sarif(report))
    report_lost = False
    if args.json:
        document = report.to_json()
        if json_to_stdout:
            out.write(sys.stdout, document)
        else:
            try:
                Path(args.json).write_text(document, encoding="utf-8")
            except OSError as exc:
                out.write(sys.stderr, printable(f"mm-schedule-codemod: cannot write {args.json}: "
                                                f"{os_reason(exc)}\n"))
                report_lost = True
    out.flush()
    summary = report.summary()
    if summary["files_failed"] or report_lost:
        return EXIT_FAILED
    if args.mode == "write":
        return EXIT_REMAINING if summary["manual"] else EXIT_OK
    return EXIT_REMAINING if report.fails_check() else EXIT_OK
