"""The codemod as a libcst command, for ``python -m libcst.tool codemod``:

    python -m libcst.tool codemod -x mm_schedule.codemods.cli.libcst_command.MoveImportsCommand \\
        --no-format PATH [--map FILE]

(``--no-format`` unless black is installed: libcst pipes changed files through its
configured formatter.) Findings are printed as libcst warnings.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
from libcst.codemod import CodemodCommand, CodemodContext

from ..engine.resolve import package_for
from ..engine.transform import migrate_module
from ..movemap.schema import load_map
from ..report.findings import render
from ..report.suppression import Suppressions


class MoveImportsCommand(CodemodCommand):
    """Run the move map through libcst's own runner:

    ``python -m libcst.tool codemod -x mm_schedule.codemods.cli.libcst_command.MoveImportsCommand
    --no-format PATH`` (add ``--map FILE`` for another split). Findings become warnings.
    """

    DESCRIPTION: str = (
        "Move imports, attribute uses and patch targets across a module split "
        "(default: sglang.srt.managers.mm_utils -> mm_schedule)."
    )

    @staticmethod
    def add_args(arg_parser) -> None:
        arg_parser.add_argument(
            "--map", dest="map_path", metavar="FILE", default=None,
            help="move map JSON (default: the shipped SGLang mm_utils -> mm_schedule map)",
        )

    def __init__(self, context: CodemodContext, map_path: str | None = None) -> None:
        super().__init__(context)
        self.move_map = load_map(map_path)

    def transform_module(self, tree: cst.Module) -> cst.Module:
        # Codemod.transform_module would deep-copy the tree for its metadata wrapper;
        # the engine wraps the fresh tree the runner parsed without copying.
        return self.transform_module_impl(tree)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        filename = self.context.filename
        package = package_for(filename, Path.cwd()) if filename else None
        if package is None:
            package = self.context.full_package_name
        suppressions = Suppressions.parse(tree.bytes)
        new_tree, findings = migrate_module(
            tree, self.move_map, path=filename or "<stdin>", package=package,
            suppressions=suppressions,
        )
        if suppressions is not None:
            findings = [f for f in findings if not suppressions.take(f.line, f.code)]
        for finding in findings:
            self.warn(render(finding, "write", with_path=False))
        return new_tree
