"""Suppression comments work like ``# noqa``: a suppressed line is left as it is, a
suppressed code leaves only that code's edits alone, and unused suppressions can be
reported (MMS016, opt-in)."""

from __future__ import annotations

import textwrap

from mm_schedule.codemods.engine.transform import migrate_source

IGNORE = "# mm-schedule-codemod: ignore"


def _migrate(source: str, move_map, **kwargs):
    source = textwrap.dedent(source)
    outcome = migrate_source(source, move_map, path="t.py", package="app", **kwargs)
    text = source if outcome.new_source is None else outcome.new_source.decode()
    return text, outcome


def test_a_bare_suppression_leaves_the_line_as_it_is_and_reports_nothing(move_map):
    source = f"""
        from sglang.srt.managers.mm_utils import get_embedding_chunk  {IGNORE}
        get_embedding_chunk()
        """
    _, outcome = _migrate(source, move_map)
    assert outcome.new_source is None and outcome.findings == [] and outcome.suppressed == 1
    # without the comment the same line is rewritten: the comment is what held it back
    plain, _ = _migrate(source.replace(IGNORE, ""), move_map)
    assert "mm_schedule import get_embedding_chunk" in plain


def test_a_suppressed_code_leaves_only_that_codes_edits_alone(move_map):
    source = f"""
        from sglang.srt.managers.mm_utils import _get_multimodal_mask, get_embedding_chunk  {IGNORE}[MMS002]
        """
    text, outcome = _migrate(source, move_map)
    assert text == textwrap.dedent(f"""
        from sglang.srt.managers.mm_schedule import get_embedding_chunk
        from sglang.srt.managers.mm_utils import _get_multimodal_mask  {IGNORE}[MMS002]
        """)  # placed where import sorting wants it
    assert [(f.code, f.symbol) for f in outcome.findings] == [("MMS001", "get_embedding_chunk")]
    assert outcome.suppressed == 1


def test_a_suppressed_use_keeps_its_binding_while_the_other_uses_move(move_map):
    source = f"""
        from sglang.srt.managers import mm_utils
        a = mm_utils.get_embedding_chunk()  {IGNORE}
        b = mm_utils.get_embedding_chunk()
        """
    text, outcome = _migrate(source, move_map)
    lines = text.splitlines()
    assert "from sglang.srt.managers import mm_utils, mm_schedule" in lines  # mm_utils: still read
    assert f"a = mm_utils.get_embedding_chunk()  {IGNORE}" in lines
    assert "b = mm_schedule.get_embedding_chunk()" in lines
    assert [f.line for f in outcome.findings] == [4] and outcome.findings[0].fixed
    again = migrate_source(text, move_map, path="t.py", package="app")
    assert again.new_source is None and again.findings == []


def test_the_only_use_suppressed_leaves_the_file_unchanged(move_map):
    source = f"""
        import sglang.srt.managers.mm_utils as m
        m._is_hip  {IGNORE}[MMS002]
        """
    _, outcome = _migrate(source, move_map)
    assert outcome.new_source is None and outcome.findings == []


def test_a_suppressed_patch_target_is_not_retargeted(move_map):
    source = f"""
        from unittest import mock
        mock.patch("sglang.srt.managers.mm_utils._get_multimodal_mask")  {IGNORE}[MMS002]
        mock.patch("sglang.srt.managers.mm_utils._get_multimodal_mask")
        """
    text, outcome = _migrate(source, move_map)
    assert text.splitlines()[2].startswith('mock.patch("sglang.srt.managers.mm_utils.')
    assert text.splitlines()[3] == 'mock.patch("sglang.srt.managers.mm_schedule._get_multimodal_mask")'
    assert [f.line for f in outcome.findings] == [4]


def test_a_rebound_global_is_left_alone_when_a_use_line_suppresses_it(move_map):
    source = f"""
        from sglang.srt.managers.mm_utils import embedding_cache
        x = embedding_cache  {IGNORE}[MMS004]
        """
    text, outcome = _migrate(source, move_map)
    assert "x = embedding_cache" in text  # the use is not turned into a module attribute
    assert [(f.code, f.fixed) for f in outcome.findings if f.code == "MMS004"] == [("MMS004", False)]


def test_another_code_on_the_line_is_still_fixed_and_the_unused_one_reported(move_map):
    source = f"""
        from sglang.srt.managers.mm_utils import get_embedding_chunk  {IGNORE}[MMS005]
        """
    text, outcome = _migrate(source, move_map)
    assert "mm_schedule import get_embedding_chunk" in text
    assert [f.code for f in outcome.findings] == ["MMS001"]
    _, reported = _migrate(source, move_map, report_unused_suppressions=True)
    assert sorted((f.code, f.line, f.symbol) for f in reported.findings) == [
        ("MMS001", 2, "get_embedding_chunk"), ("MMS016", 2, "MMS005")]


def test_unused_suppressions_are_reported_only_when_asked(move_map):
    source = f"""
        import os  {IGNORE}
        from sglang.srt.managers.mm_utils import get_embedding_chunk  {IGNORE}
        text = "{IGNORE}"
        """
    _, quiet = _migrate(source, move_map)
    assert quiet.findings == []
    _, outcome = _migrate(source, move_map, report_unused_suppressions=True)
    # the used one on line 3 is not reported; a marker inside a string is no comment
    assert [(f.line, f.code, f.symbol) for f in outcome.findings] == [(2, "MMS016", "ignore")]
    assert "suppresses nothing" in outcome.findings[0].message


def test_a_file_not_mentioning_the_module_still_gets_its_unused_suppressions(move_map):
    source = f"x = 1  {IGNORE}[MMS001]\n"
    assert migrate_source(source, move_map, path="t.py").findings == []
    outcome = migrate_source(source, move_map, path="t.py", report_unused_suppressions=True)
    assert [(f.code, f.symbol) for f in outcome.findings] == [("MMS016", "MMS001")]


def test_the_cli_flag_reports_unused_suppressions(tree, map_file, cli_main, capsys):
    (tree / "a.py").write_text(f"x = 1  {IGNORE}\n")
    assert cli_main(".", map_file=map_file) == 0
    assert cli_main(".", "--report-unused-suppressions", map_file=map_file) == 1
    out = capsys.readouterr().out
    assert "a.py:1:1: MMS016 [manual] suppression comment suppresses nothing" in out
