"""Jupyter notebooks: code cells migrated together, IPython syntax and other cells left
alone, the JSON layout kept, findings reported with their cell."""

from __future__ import annotations

import json


def _notebook(cells, *, indent=1, language="python"):
    doc = {
        "cells": [
            {"cell_type": kind, "metadata": {}, "source": source,
             **({"execution_count": None, "outputs": []} if kind == "code" else {})}
            for kind, source in cells
        ],
        "metadata": {"language_info": {"name": language}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(doc, indent=indent, sort_keys=True, ensure_ascii=False) + "\n"


CELLS = [
    ("markdown", ["# Uses get_embedding_chunk from sglang.srt.managers.mm_utils\n"]),
    ("code", ["%load_ext autoreload\n",
              "import sglang.srt.managers.mm_utils as mmu\n",
              "from sglang.srt.managers.mm_utils import get_embedding_chunk, hash_feature\n",
              "!pip list | grep sglang"]),
    ("code", ["%%bash\n", "echo sglang.srt.managers.mm_utils\n"]),
    ("code", ["files = !ls\n", "mmu.get_embedding_chunk?\n", "result = mmu.get_embedding_chunk(1)\n",
              'print("café")']),
]


def test_a_notebook_is_migrated_cell_by_cell_with_its_layout_kept(tree, map_file, capsys, cli_main):
    path = tree / "demo.ipynb"
    before = _notebook(CELLS)
    path.write_text(before, encoding="utf-8")
    assert cli_main("--write", ".", map_file=map_file) == 0
    after = path.read_text(encoding="utf-8")
    cells = json.loads(after)["cells"]
    assert cells[0] == json.loads(before)["cells"][0]  # markdown untouched
    assert cells[1]["source"] == [
        "%load_ext autoreload\n",
        # every use of the alias (in the last cell) moved, so the alias follows them
        "import sglang.srt.managers.mm_schedule as mmu\n",
        "from sglang.srt.managers.mm_schedule import get_embedding_chunk\n",
        "from sglang.srt.managers.mm_utils import hash_feature\n",
        "!pip list | grep sglang",
    ]
    assert cells[2] == json.loads(before)["cells"][2]  # a %%bash cell is not Python
    assert cells[3]["source"] == CELLS[3][1]  # IPython syntax and the aliased use as they were
    # Only the edited source lines differ in the file's text (same indentation, order, escapes).
    old_lines, new_lines = before.splitlines(), after.splitlines()
    changed = [line for line in new_lines if line not in old_lines]
    assert changed == [f"    {json.dumps(line)}," for line in cells[1]["source"][1:4]]
    assert "é" in after  # not escaped: the file's own choice is kept
    out = capsys.readouterr().out
    assert "demo.ipynb:cell 2:3:" in out and "demo.ipynb:cell 4:3:" in out, out
    assert cli_main("--check", ".", map_file=map_file) == 0  # idempotent


def test_notebook_findings_in_json_carry_the_cell(tree, map_file, cli_main):
    (tree / "demo.ipynb").write_text(_notebook(CELLS, indent=2))
    report = tree.parent / "r.json"
    assert cli_main(".", "--json", report, map_file=map_file) == 1
    doc = json.loads(report.read_text())
    assert {(f["path"], f["cell"]) for f in doc["findings"]} == {("demo.ipynb", 2),
                                                               ("demo.ipynb", 4)}
    assert doc["would_change_files"] == ["demo.ipynb"]


def test_a_notebook_whose_layout_cannot_be_kept_is_reported_not_written(tree, map_file, capsys, cli_main):
    text = _notebook(CELLS).replace('\n "nbformat"', '\n    "nbformat"')  # hand-edited spacing
    (tree / "odd.ipynb").write_text(text, encoding="utf-8")
    assert cli_main("--write", ".", map_file=map_file) == 2
    assert (tree / "odd.ipynb").read_text(encoding="utf-8") == text
    out, err = capsys.readouterr()
    assert "odd.ipynb: MMS911 [error] its JSON layout cannot be reproduced; not written" in err
    assert "odd.ipynb:cell 2:3:" in out and "[fixable]" in out


def test_an_unreadable_notebook_and_other_languages(tree, map_file, capsys, cli_main):
    (tree / "broken.ipynb").write_text('{"cells": [sglang.srt.managers.mm_utils')
    r_cells = [("code", ["import sglang.srt.managers.mm_utils\n"])]
    (tree / "r.ipynb").write_text(_notebook(r_cells, language="R"))
    assert cli_main("--write", ".", map_file=map_file) == 2
    err = capsys.readouterr().err
    assert "broken.ipynb: MMS906 [error] cannot parse: not a readable notebook" in err
    assert "r.ipynb" not in err


def test_a_notebook_of_the_wrong_shape_is_a_parse_failure_not_a_crash(tree, map_file, capsys,
                                                                      cli_main):
    old = "import sglang.srt.managers.mm_utils"
    shapes = {
        "list.ipynb": [old],
        "cells.ipynb": {"cells": 5, "x": old},
        "cell.ipynb": {"cells": [5, old]},
        "source.ipynb": {"cells": [{"cell_type": "code", "source": 5}], "x": old},
        "pieces.ipynb": {"cells": [{"cell_type": "code", "source": [old, 5]}]},
    }
    for name, doc in shapes.items():
        (tree / name).write_text(json.dumps(doc))
    (tree / "a.py").write_text("from sglang.srt.managers.mm_utils import get_embedding_chunk\n")
    assert cli_main("--write", ".", map_file=map_file) == 2
    err = capsys.readouterr().err
    reasons = {"list.ipynb": "expected a JSON object with a list of 'cells'",
               "cells.ipynb": "expected a JSON object with a list of 'cells'",
               "cell.ipynb": "cell 1 is not a JSON object",
               "source.ipynb": "cell 1: 'source' must be a string or a list of strings",
               "pieces.ipynb": "cell 1: 'source' must be a string or a list of strings"}
    for name, reason in reasons.items():
        assert f"{name}: MMS906 [error] cannot parse: not a readable notebook: {reason};" in err
    assert "internal error" not in err
    assert "mm_schedule import" in (tree / "a.py").read_text()
