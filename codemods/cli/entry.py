"""``mm-schedule-codemod``: migrate code across a module split (and ``derive`` a map).

The exit statuses are listed once, in ``EXIT_STATUS_HELP`` (the end of ``--help``).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys

from ..pipeline import run
from ..report.exit_status import (
    EXIT_INTERRUPTED,
    EXIT_STATUS_HELP,
    EXIT_TERMINATED,
    EXIT_USAGE,
    UsageError,
    UsageParser,
)
from ..report.formats import FORMATS, installed_version
from ..report.run_report import printable


class _Terminated(BaseException):
    """SIGTERM, turned into an exception so the run stops between two files."""


def _positive(kind: type, what: str):
    """An argparse type: a finite number above zero."""
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"expected {what} above 0, got {text!r}")
        return value

    return convert


def _codes(text: str) -> list[str]:
    """An argparse type: comma-separated selectors (``MMS001,MMS01``)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = UsageParser(
        prog="mm-schedule-codemod",
        description=(
            "Migrate code across a module split (default: SGLang's\n"
            "sglang.srt.managers.mm_utils -> mm_schedule).\n"
            "'mm-schedule-codemod derive --help' builds a move map from two source versions."
        ),
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="files or folders to process; '-' reads one file from stdin "
                             "(with --write its result goes to stdout)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", dest="mode", action="store_const", const="check",
                      help="write nothing; exit 1 if changes or findings remain (default)")
    mode.add_argument("--diff", dest="mode", action="store_const", const="diff",
                      help="print a unified diff (git apply and patch -p1 accept it); exit as --check")
    mode.add_argument("--write", dest="mode", action="store_const", const="write",
                      help="apply the changes in place, atomically per file")
    parser.add_argument("--json", metavar="FILE", help="write a JSON report ('-' for stdout)")
    parser.add_argument("--map", metavar="FILE", help="move map JSON (default: the shipped SGLang map)")
    parser.add_argument("--target-version", metavar="VERSION",
                        help="the release you move to, any the map covers (default: the "
                             "newest); what is gone from the old module by then is reported")
    parser.add_argument("-j", "--jobs", type=_positive(int, "a whole number"), default=None,
                        help="worker processes (default: CPU count)")
    parser.add_argument("--timeout", type=_positive(float, "a number of seconds"),
                        default=300.0, metavar="SECONDS",
                        help="give up on a file after this long (default 300)")
    parser.add_argument("--exclude", metavar="PATTERN", action="append", default=None,
                        help="files or folders to leave out, replacing the built-in list "
                             "(repeatable)")
    parser.add_argument("--extend-exclude", metavar="PATTERN", action="append", default=[],
                        help="more files or folders to leave out (repeatable)")
    parser.add_argument("--force-exclude", action="store_true", default=None,
                        help="apply the excludes to files named on the command line too")
    parser.add_argument("--no-respect-gitignore", dest="respect_gitignore",
                        action="store_false", default=None, help="do not read .gitignore files")
    parser.add_argument("--stdin-filename", metavar="PATH",
                        help="the name of the file read from '-': its package, settings and "
                             "excludes, and the name in messages")
    parser.add_argument("--select", metavar="CODES", type=_codes, default=None,
                        help="the codes to act on, replacing the settings' selection: "
                             "comma-separated codes, prefixes (MMS0) or ALL")
    parser.add_argument("--extend-select", metavar="CODES", type=_codes, action="extend",
                        default=[], help="codes to act on as well (repeatable)")
    parser.add_argument("--ignore", metavar="CODES", type=_codes, action="extend", default=[],
                        help="codes to leave alone: neither reported nor fixed (repeatable)")
    parser.add_argument("--report-unused-suppressions", action="store_true",
                        help="report suppression comments that suppress nothing (the same "
                             "as --extend-select MMS016)")
    parser.add_argument("--output-format", choices=FORMATS, default="text",
                        help="how findings are printed: text (default), concise, json (the "
                             "--json document), github (Actions annotations), sarif (2.1.0)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the summary")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also list what was skipped and why")
    parser.set_defaults(mode="check")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "derive":
        from ..movemap.derive_cli import main as derive_main

        return derive_main(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    previous = _on_sigterm()
    try:
        return run(args)
    except UsageError as exc:
        print(printable(f"mm-schedule-codemod: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("mm-schedule-codemod: interrupted; every file is either as it was or fully "
              "migrated", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _Terminated:
        print("mm-schedule-codemod: terminated; every file is either as it was or fully "
              "migrated", file=sys.stderr)
        return EXIT_TERMINATED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _on_sigterm():
    def stop(signum, frame):
        raise _Terminated

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        return None


