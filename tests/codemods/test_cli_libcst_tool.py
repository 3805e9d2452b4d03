"""The same transform driven by libcst's runner and its CodemodTest helper."""

from __future__ import annotations

import subprocess
import sys

from libcst.codemod import CodemodContext, CodemodTest

from mm_schedule.codemods.cli.libcst_command import MoveImportsCommand


class TestMoveImportsCommand(CodemodTest):
    TRANSFORM = MoveImportsCommand

    def test_from_import_and_attribute_use(self) -> None:
        before = """
            from sglang.srt.managers.mm_utils import hash_feature, _is_hip
            from sglang.srt.managers import mm_utils
            mm_utils.get_embedding_chunk()
        """
        after = """
            from sglang.srt.managers.mm_utils import hash_feature
            from sglang.srt.managers.mm_schedule import _is_hip
            from sglang.srt.managers import mm_schedule
            mm_schedule.get_embedding_chunk()
        """
        self.assertCodemod(
            before, after,
            expected_warnings=[
                "1:56: MMS002 [fixed] import: private '_is_hip' moved to "
                "sglang.srt.managers.mm_schedule; it is private there and may change without notice",
                "3:1: MMS001 [fixed] attribute: 'get_embedding_chunk' moved to "
                "sglang.srt.managers.mm_schedule",
            ],
        )

    def test_relative_import_uses_the_context_package(self) -> None:
        self.assertCodemod(
            "from .mm_utils import _is_hip\n",
            "from .mm_schedule import _is_hip\n",
            context_override=CodemodContext(full_package_name="sglang.srt.managers"),
            expected_warnings=[
                "1:23: MMS002 [fixed] import: private '_is_hip' moved to "
                "sglang.srt.managers.mm_schedule; it is private there and may change without notice",
            ],
        )

    def test_custom_map_argument(self) -> None:
        self.assertCodemod("import os\n", "import os\n", map_path=None)


def test_libcst_tool_runs_the_command_by_dotted_path(tmp_path, map_file):
    target = tmp_path / "user.py"
    target.write_text("from sglang.srt.managers.mm_utils import get_embedding_chunk\n")
    proc = subprocess.run(
        [sys.executable, "-m", "libcst.tool", "codemod", "-x",
         "mm_schedule.codemods.cli.libcst_command.MoveImportsCommand", "--no-format", "--hide-progress",
         "-j", "1", str(target), "--map", str(map_file)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert target.read_text() == "from sglang.srt.managers.mm_schedule import get_embedding_chunk\n"
    assert "MMS001" in proc.stderr
