"""Suppression comments work like ``# noqa`` (and ``# noqa: MMSxxx`` is one): a suppressed
statement is left as it is, whichever of its lines the comment is on, a suppressed code
leaves only that code's edits alone, and unused suppressions can be reported (MMS016,
opt-in)."""

from __future__ import annotations

import textwrap

import pytest

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


# --- a statement spread over several lines ---------------------------------------------
# (rule, setup lines, the statement's lines, the code it raises). The suppression comment
# is put at the end of each of the statement's lines in turn: wherever it is, it covers
# the whole statement.
MULTI_LINE = [
    ("from-imports, parenthesised", [], [
        "from sglang.srt.managers.mm_utils import (",
        "    get_embedding_chunk,",
        "    hash_feature,",
        ")"], "MMS001"),
    ("from-imports, removed name", [], [
        "from sglang.srt.managers.mm_utils import (",
        "    old_helper,",
        ")"], "MMS009"),
    ("from-imports, unmapped import", [], [
        "from sglang.srt.managers.mm_utils import (",
        "    np,",
        ")"], "MMS010"),
    ("rebound global", [], [
        "from sglang.srt.managers.mm_utils import (",
        "    embedding_cache,",
        ")"], "MMS004"),
    ("module attribute in a plain call", ["from sglang.srt.managers import mm_utils"], [
        "value = mm_utils.get_embedding_chunk(",
        "    1,",
        "    2,",
        ")"], "MMS001"),
    ("black-formatted mock.patch", ["from unittest import mock"], [
        "mock.patch(",
        '    "sglang.srt.managers.mm_utils._get_multimodal_mask"',
        ")"], "MMS002"),
    ("mock.patch in a with statement", ["from unittest import mock"], [
        "with mock.patch(",
        '    "sglang.srt.managers.mm_utils.get_embedding_chunk"',
        "):",
        "    pass"], "MMS001"),
    ("decorator", ["from unittest import mock"], [
        "@mock.patch(",
        '    "sglang.srt.managers.mm_utils.get_embedding_chunk",',
        ")"], "MMS001"),
    ("getattr", ["import sglang.srt.managers.mm_utils as m"], [
        "getattr(",
        "    m,",
        '    "get_embedding_chunk",',
        ")"], "MMS001"),
    ("computed patch target", ["from unittest import mock", 'MM = "sglang.srt.managers.mm_utils"'], [
        "mock.patch(",
        '    f"{MM}.get_embedding_chunk"',
        ")"], "MMS012"),
    ("old-site patch of a re-exported name", ["from unittest import mock"], [
        "mock.patch(",
        '    "sglang.srt.managers.mm_utils.get_embedding_and_mask"',
        ")"], "MMS005"),
    ("old-site assignment", ["from sglang.srt.managers import mm_utils"], [
        "mm_utils.get_embedding_and_mask = (",
        "    fake",
        ")"], "MMS005"),
    ("sys.modules entry", ["import sys"], [
        "sys.modules.setdefault(",
        '    "sglang.srt.managers.mm_utils",',
        "    None,",
        ")"], "MMS013"),
    ("path loader", [], [
        "path = (",
        '    "sglang/srt/managers/mm_utils.py"',
        ")"], "MMS008"),
]


def _statement_with_comment(setup, lines, at, comment):
    body = [line + (f"  {comment}" if i == at else "") for i, line in enumerate(lines)]
    # the decorated function and the with body are not part of the suppressed statement
    tail = ["def decorated():", "    pass"] if lines[0].startswith("@") else []
    return "\n".join([*setup, *body, *tail]) + "\n"


def _cases():
    for name, setup, lines, code in MULTI_LINE:
        statement_lines = len(lines) - (1 if lines[-1] == "    pass" else 0)
        for at in range(statement_lines):
            yield pytest.param(setup, lines, code, at, id=f"{name}-line{at + 1}of{statement_lines}")


@pytest.mark.parametrize("setup, lines, code, at", list(_cases()))
@pytest.mark.parametrize("comment", [IGNORE, f"{IGNORE}[{{code}}]", "# noqa: E501, {code}"],
                         ids=["bare", "listed", "noqa"])
def test_a_suppression_on_any_line_of_a_statement_covers_it(move_map, setup, lines, code, at, comment):
    comment = comment.format(code=code)
    plain = _statement_with_comment(setup, lines, None, comment)
    before = migrate_source(plain, move_map, path="t.py", package="app")
    assert code in [f.code for f in before.findings]  # what the comment has to hold back
    source = _statement_with_comment(setup, lines, at, comment)
    outcome = migrate_source(source, move_map, path="t.py", package="app",
                             report_unused_suppressions=True)
    assert code not in [f.code for f in outcome.findings]
    assert "MMS016" not in [f.code for f in outcome.findings]  # the comment was used
    if comment.startswith(IGNORE + "[") or "noqa" in comment:
        # other codes of the statement (a rebound global also moves) are still acted on
        if {f.code for f in before.findings} != {code}:
            return
    text = source if outcome.new_source is None else outcome.new_source.decode()
    statement = "\n".join(source.splitlines()[len(setup):len(setup) + len(lines)])
    assert statement in text  # left exactly as written


def test_a_suppression_does_not_reach_past_its_statement(move_map):
    source = textwrap.dedent(f"""
        from unittest import mock
        mock.patch(
            "sglang.srt.managers.mm_utils._get_multimodal_mask"
        )  {IGNORE}
        mock.patch(
            "sglang.srt.managers.mm_utils._get_multimodal_mask"
        )
        """)
    outcome = migrate_source(source, move_map, path="t.py", package="app")
    assert [(f.code, f.line) for f in outcome.findings] == [("MMS002", 7)]
    assert outcome.new_source.decode().count("mm_schedule._get_multimodal_mask") == 1


def test_a_comment_on_its_own_line_suppresses_nothing(move_map):
    source = f"""
        {IGNORE}
        from sglang.srt.managers.mm_utils import get_embedding_chunk
        """
    text, outcome = _migrate(source, move_map, report_unused_suppressions=True)
    assert "mm_schedule import get_embedding_chunk" in text
    assert sorted((f.code, f.line) for f in outcome.findings) == [("MMS001", 3), ("MMS016", 2)]


def test_noqa_with_only_other_tools_codes_or_bare_is_no_suppression(move_map):
    for comment in ("# noqa", "# noqa: E501", "# NOQA:F401,E501"):
        source = f"from sglang.srt.managers.mm_utils import get_embedding_chunk  {comment}\n"
        outcome = migrate_source(source, move_map, path="t.py", package="app",
                                 report_unused_suppressions=True)
        assert [f.code for f in outcome.findings] == ["MMS001"], comment  # not MMS016 either
        assert outcome.new_source is not None


def test_an_unused_noqa_code_is_reported_like_an_unused_ignore(move_map):
    source = ("from sglang.srt.managers.mm_utils import get_embedding_chunk  "
              "# noqa: E501, MMS001 mms005\n")
    outcome = migrate_source(source, move_map, path="t.py", package="app",
                             report_unused_suppressions=True)
    assert outcome.new_source is None
    assert [(f.code, f.symbol) for f in outcome.findings] == [("MMS016", "MMS005")]


@pytest.mark.parametrize("statement, use, code", [
    # a backslash continuation: the comment can only end the last line
    ("from sglang.srt.managers.mm_utils \\\n    import *", "get_embedding_chunk()\n", "MMS006"),
    # a docstring's doctest: the comment follows the closing quotes
    ('def f():\n    """\n    >>> from sglang.srt.managers.mm_utils import get_embedding_chunk\n    """',
     "", "MMS014"),
], ids=["star-imports", "doc-references"])
def test_a_suppression_after_the_last_line_covers_a_finding_on_the_first(move_map, statement, use, code):
    plain = migrate_source(f"{statement}\n{use}", move_map, path="t.py", package="app")
    assert code in [f.code for f in plain.findings]
    suppressed = migrate_source(f"{statement}  {IGNORE}[{code}]\n{use}", move_map, path="t.py",
                                package="app", report_unused_suppressions=True)
    assert [f.code for f in suppressed.findings if f.code in (code, "MMS016")] == []
