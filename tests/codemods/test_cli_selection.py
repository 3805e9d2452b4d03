"""Which codes a run acts on: ``--select`` / ``--extend-select`` / ``--ignore`` and the
settings' ``select`` / ``extend-select`` / ``ignore``, resolved as ruff resolves them; a
code left out is neither reported nor fixed; codes off by default are turned on by any
selector that names them."""

from __future__ import annotations

import json

import pytest

from mm_schedule.codemods import rules
from mm_schedule.codemods.engine.transform import migrate_source
from mm_schedule.codemods.report.selection import Layer, SelectionError, resolve

CODES = ["MMS001", "MMS002", "MMS010", "MMS011", "MMS016", "MMS017"]
OFF = ["MMS016", "MMS017"]


def _resolve(*layers):
    return sorted(resolve(list(layers), CODES, OFF).codes)


def test_the_default_is_every_code_but_those_off_by_default():
    assert _resolve() == ["MMS001", "MMS002", "MMS010", "MMS011"]
    assert _resolve(Layer(ignore=["MMS01"])) == ["MMS001", "MMS002"]


@pytest.mark.parametrize("layer, expected", [
    (Layer(select=["ALL"]), CODES),  # ALL turns on what is off by default
    (Layer(select=["MMS00"]), ["MMS001", "MMS002"]),
    (Layer(select=["mms001"]), ["MMS001"]),
    (Layer(extend_select=["MMS017"]), ["MMS001", "MMS002", "MMS010", "MMS011", "MMS017"]),
    (Layer(select=["MMS0"], ignore=["MMS01"]), ["MMS001", "MMS002"]),
    # the more specific selector wins, whichever list it is in
    (Layer(select=["MMS001"], ignore=["MMS0"]), ["MMS001"]),
    (Layer(select=["MMS0"], ignore=["MMS001"]), ["MMS002", "MMS010", "MMS011", "MMS016", "MMS017"]),
    (Layer(ignore=["ALL"], extend_select=["MMS010"]), ["MMS010"]),
    # the same specificity: ignore wins
    (Layer(select=["MMS001"], ignore=["MMS001"]), []),
])
def test_one_layer(layer, expected):
    assert _resolve(layer) == sorted(expected)


def test_a_later_select_starts_again_and_a_later_ignore_or_extension_builds_on_the_earlier():
    settings = Layer(select=["MMS00"], ignore=["MMS002"])
    assert _resolve(settings, Layer(select=["MMS01"])) == ["MMS010", "MMS011", "MMS016", "MMS017"]
    assert _resolve(settings, Layer(extend_select=["MMS011"])) == ["MMS001", "MMS011"]
    assert _resolve(settings, Layer(ignore=["MMS001"])) == []
    # what the command line re-selects comes back even if the settings ignored it
    assert _resolve(settings, Layer(extend_select=["MMS002"])) == ["MMS001", "MMS002"]


@pytest.mark.parametrize("layers, codes, lenient", [
    ([], ["MMS001", "MMS002", "MMS010", "MMS011"], ["MMS011"]),
    # a selector that names the optional code makes it fail --check: the code, a prefix, ALL
    ([Layer(extend_select=["MMS011"])], ["MMS001", "MMS002", "MMS010", "MMS011"], []),
    ([Layer(extend_select=["MMS01"])], ["MMS001", "MMS002", "MMS010", "MMS011", "MMS016", "MMS017"], []),
    ([Layer(select=["ALL"])], CODES, []),
    # one that does not name it leaves it lenient; a select without it drops it
    ([Layer(extend_select=["MMS017"])], ["MMS001", "MMS002", "MMS010", "MMS011", "MMS017"], ["MMS011"]),
    ([Layer(select=["MMS00"])], ["MMS001", "MMS002"], []),
    ([Layer(ignore=["MMS011"])], ["MMS001", "MMS002", "MMS010"], []),
    # named in the settings, ignored then re-selected by the command line: named again
    ([Layer(extend_select=["MMS011"]), Layer(ignore=["MMS011"])], ["MMS001", "MMS002", "MMS010"], []),
    ([Layer(select=["MMS0"]), Layer(ignore=["MMS01"]), Layer(extend_select=["MMS011"])],
     ["MMS001", "MMS002", "MMS011"], []),
    # a later select of the default codes only forgets that an earlier layer named it
    ([Layer(extend_select=["MMS011"]), Layer(select=["MMS00"])], ["MMS001", "MMS002"], []),
])
def test_an_optional_code_is_selected_by_default_and_fails_check_once_named(layers, codes, lenient):
    selection = resolve(layers, CODES, OFF, optional=["MMS011"])
    assert sorted(selection.codes) == sorted(codes)
    assert sorted(selection.lenient) == lenient
    assert selection.lenient <= selection.codes


def test_the_real_table_has_the_reexported_name_code_optional():
    assert rules.OPTIONAL == {"MMS017"} and "MMS017" in rules.DEFAULT_SELECTION
    assert not rules.OPTIONAL & rules.OFF_BY_DEFAULT


@pytest.mark.parametrize("selector", ["MMS9", "F401", "", "MMS0011"])
def test_an_unknown_selector_is_an_error_naming_it(selector):
    with pytest.raises(SelectionError, match="unknown rule selector"):
        resolve([Layer(select=[selector], source="pyproject.toml")], CODES, OFF)


def test_the_real_table_has_the_unused_suppression_code_off_by_default():
    assert "MMS016" in rules.CODES and "MMS016" in rules.OFF_BY_DEFAULT
    assert rules.DEFAULT_SELECTION == frozenset(rules.CODES) - rules.OFF_BY_DEFAULT
    assert set(rules.OFF_BY_DEFAULT) <= set(rules.CODES)


def test_a_code_not_selected_is_neither_fixed_nor_reported(move_map):
    source = ("from sglang.srt.managers.mm_utils import _get_multimodal_mask, get_embedding_chunk\n"
              "from sglang.srt.managers.mm_utils import old_helper\n")
    everything = migrate_source(source, move_map, path="t.py", package="app")
    assert sorted(f.code for f in everything.findings) == ["MMS001", "MMS002", "MMS009"]
    only = migrate_source(source, move_map, path="t.py", package="app",
                          selected=rules.DEFAULT_SELECTION - {"MMS002", "MMS009"})
    assert [f.code for f in only.findings] == ["MMS001"]
    text = only.new_source.decode()
    assert "mm_schedule import get_embedding_chunk" in text
    assert "mm_utils import _get_multimodal_mask" in text  # left where it was
    none = migrate_source(source, move_map, path="t.py", package="app", selected=frozenset())
    assert none.new_source is None and none.findings == []


MIXED = ("from sglang.srt.managers.mm_utils import _get_multimodal_mask, get_embedding_chunk\n")


def test_the_command_line_selects_and_ignores(tree, map_file, cli_main, capsys):
    (tree / "a.py").write_text(MIXED)
    assert cli_main(".", "--ignore", "MMS001,MMS002", map_file=map_file) == 0
    assert "MMS00" not in capsys.readouterr().out
    assert cli_main(".", "--select", "MMS002", map_file=map_file) == 1
    out = capsys.readouterr().out
    assert "MMS002" in out and "MMS001" not in out
    assert cli_main("--write", ".", "--select", "MMS0", "--ignore", "MMS002", map_file=map_file) == 0
    assert (tree / "a.py").read_text() == (
        "from sglang.srt.managers.mm_schedule import get_embedding_chunk\n"
        "from sglang.srt.managers.mm_utils import _get_multimodal_mask\n")


def test_the_settings_select_and_the_command_line_wins(tree, map_file, cli_main, capsys):
    (tree / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nignore = ["MMS002"]\n'
                                         'extend-select = ["MMS016"]\n')
    (tree / "a.py").write_text(MIXED)
    (tree / "b.py").write_text("x = 1  # mm-schedule-codemod: ignore\n")
    assert cli_main(".", "--json", "-", map_file=map_file) == 1
    codes = sorted(f["code"] for f in json.loads(capsys.readouterr().out)["findings"])
    assert codes == ["MMS001", "MMS016"]  # MMS016: off by default, extended by the settings
    assert cli_main(".", "--select", "MMS002", "--json", "-", map_file=map_file) == 1
    codes = sorted(f["code"] for f in json.loads(capsys.readouterr().out)["findings"])
    assert codes == ["MMS002"]


@pytest.mark.parametrize("args, where", [
    (("--select", "MMS9"), "command line"),
    (("--ignore", "E501"), "command line"),
])
def test_an_unknown_selector_exits_3(tree, map_file, cli_main, capsys, args, where):
    (tree / "a.py").write_text(MIXED)
    assert cli_main(".", *args, map_file=map_file) == 3
    err = capsys.readouterr().err
    assert f"{where}: unknown rule selector {args[1]!r}" in err


def test_an_unknown_selector_in_the_settings_exits_3_naming_the_file(tree, map_file, cli_main, capsys):
    (tree / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nselect = ["MMS99"]\n')
    (tree / "a.py").write_text(MIXED)
    assert cli_main(".", map_file=map_file) == 3
    assert f"{tree / 'pyproject.toml'}: unknown rule selector 'MMS99'" in capsys.readouterr().err
    (tree / "pyproject.toml").write_text('[tool.mm-schedule-codemod]\nignore = "MMS001"\n')
    assert cli_main(".", map_file=map_file) == 3
    assert "ignore must be a list of strings" in capsys.readouterr().err


def test_ignoring_the_fork_code_silences_the_fork_warning(tree, map_file, cli_main, capsys):
    fork = tree / "sglang" / "srt" / "managers"
    fork.mkdir(parents=True)
    (fork / "mm_utils.py").write_text("def get_embedding_chunk():\n    pass\n")
    (tree / "a.py").write_text("from sglang.srt.managers.mm_utils import get_embedding_chunk\n")
    assert cli_main(".", map_file=map_file) == 1
    assert "MMS015" in capsys.readouterr().out
    cli_main(".", "--ignore", "MMS015", map_file=map_file)
    captured = capsys.readouterr()
    assert "MMS015" not in captured.out and "warning" not in captured.err


def test_a_code_off_by_default_is_acted_on_only_when_selected(move_map, monkeypatch):
    """A rule may keep codes off by default; ALL, a prefix or the code turn them on."""
    from mm_schedule.codemods.rules.rule import Rule

    def plan(m):
        m.report(m.facts.module, "MMS099", "x", "probe", False)

    probe = Rule("probe", plan, lambda scan: True, {"MMS099": ("probe", "test")},
                 off_by_default=frozenset({"MMS099"}))
    monkeypatch.setattr(rules, "RULES", (*rules.RULES, probe))
    codes = {**rules.CODES, "MMS099": ("probe", "test")}
    off = rules.OFF_BY_DEFAULT | probe.off_by_default
    source = "from sglang.srt.managers.mm_utils import hash_feature\n"
    for layers, on in (([], False), ([Layer(select=["ALL"])], True),
                       ([Layer(extend_select=["MMS09"])], True), ([Layer(select=["MMS099"])], True)):
        selected = resolve(layers, codes, off).codes
        outcome = migrate_source(source, move_map, path="t.py", package="app", selected=selected)
        assert ("MMS099" in [f.code for f in outcome.findings]) is on, layers
