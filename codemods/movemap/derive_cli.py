"""``mm-schedule-codemod derive``: the command line of ``derive``.

``python -m mm_schedule.codemods.movemap.derive_cli --help`` runs it as well.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ...errors import MoveMapError
from ..report.exit_status import EXIT_FAILED, EXIT_OK, EXIT_REMAINING, EXIT_USAGE, UsageParser
from ..workspace.writing import unwritable_reason
from .derive import PROG, SGLANG_NEW_MODULE, SGLANG_OLD_MODULE, derive_from_wheels, derive_map
from .schema import MoveMap, load_map
from .sources import WHEEL_CACHE_ENV


def _parser() -> argparse.ArgumentParser:
    parser = UsageParser(
        prog=PROG,
        description="Derive a codemod move map from two versions of a module's source (by AST).",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--old", metavar="FILE", help="the old module's source file")
    src.add_argument(
        "--from-wheels", nargs=2, metavar=("OLD", "NEW"),
        help="read the module files out of two wheels; each a .whl path or a pin like sglang==0.5.17 "
        "(downloaded with pip into --wheel-cache)",
    )
    parser.add_argument("--history", nargs="+", metavar="ARCHIVE",
                        help="with --from-wheels: every release the map covers, oldest first (paths or "
                        "pins; a pin is read off the index one file at a time): what each module bound "
                        "in each, so that the codemod can aim at any of them (--target-version)")
    parser.add_argument("--index-url", metavar="URL",
                        help="the package index --history pins are read from (default PyPI)")
    parser.add_argument("--new", nargs="+", metavar="FILE",
                        help="with --old: the new old-module file, then the new module's file")
    parser.add_argument("--old-module", metavar="M", help="dotted name of the module names moved out of")
    parser.add_argument("--new-module", metavar="M", help="dotted name of the module names moved into")
    parser.add_argument("--package-root", metavar="NAME",
                        help="with --old/--new: read module names from the file paths, starting at NAME")
    parser.add_argument("--wheel-cache", metavar="DIR", type=Path,
                        help=f"where --from-wheels keeps downloads (default ${WHEEL_CACHE_ENV}, else"
                             " ~/.cache/mm-schedule/wheels)")
    parser.add_argument("-o", "--output", metavar="OUT.json", help="write the map here (default: stdout)")
    parser.add_argument("--check", metavar="MAP.json",
                        help="exit 1 (and print a diff) when the derived map differs from this one")
    return parser


def _content(m: MoveMap) -> str:
    """A map's text without its header: what drift is measured on."""
    data = m.to_dict()
    data.pop("header")
    return json.dumps(data, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["derive"]:
        argv = argv[1:]
    parser = _parser()
    args = parser.parse_args(argv)
    reason = unwritable_reason(args.output) if args.output else None
    if reason:  # said before a derivation that may download wheels
        parser.error(f"-o {args.output}: {reason}")
    try:
        if args.from_wheels:
            if args.new or args.package_root:
                parser.error("--new and --package-root go with --old, not --from-wheels")
            derived = derive_from_wheels(
                *args.from_wheels,
                old_module=args.old_module or SGLANG_OLD_MODULE,
                new_module=args.new_module or SGLANG_NEW_MODULE,
                cache=args.wheel_cache,
                history=args.history or (),
                index_url=args.index_url,
            )
        else:
            if not args.new:
                parser.error("--old needs --new FILE [FILE]")
            derived = derive_map(args.old, args.new, old_module=args.old_module,
                                 new_module=args.new_module, package_root=args.package_root)
        checked = load_map(args.check, aimed=False) if args.check else None
    except MoveMapError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    text = derived.to_json()
    if args.output:
        out = Path(args.output)
        tmp = out.with_name(out.name + ".tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, out)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            print(f"{PROG}: error: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
    elif checked is None:
        sys.stdout.write(text)

    if checked is None:
        return EXIT_OK
    if checked == derived:
        print(f"{args.check}: up to date with {derived.header['command']}", file=sys.stderr)
        return EXIT_OK
    diff = difflib.unified_diff(
        _content(checked).splitlines(keepends=True), _content(derived).splitlines(keepends=True),
        fromfile=f"{args.check} (checked in)", tofile="derived",
    )
    sys.stdout.writelines(diff)
    print(f"{args.check}: differs from the derived map (drift); regenerate with: "
          f"{derived.header['command']} -o {args.check}", file=sys.stderr)
    return EXIT_REMAINING


if __name__ == "__main__":
    sys.exit(main())
