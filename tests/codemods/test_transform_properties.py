"""Properties over whole files: bytes outside edited lines, idempotence, the gates."""

from __future__ import annotations

import difflib
import random

from mm_schedule.codemods.engine.transform import migrate_source
from mm_schedule.codemods.fastpath.gate import Gate

ODD_FORMATTING = (
    "#!/usr/bin/env python\n"
    "# -*- coding: utf-8 -*-\n"
    "import   os ,sys\t# spaced   oddly\n"
    "from sglang.srt.managers.mm_utils import (get_embedding_chunk ,\n"
    "        hash_feature)   # trailing\n"
    "x = [1,2,\n"
    "     3]  ;  y = 'mm_utils'\n"
    "def f( a ):\n"
    "\tfrom sglang.srt.managers.mm_utils import _is_hip\n"
    "\treturn   _is_hip\n"
)


def _changed_lines(before: str, after: str) -> list[str]:
    return [
        line for line in difflib.ndiff(before.splitlines(True), after.splitlines(True))
        if line.startswith(("- ", "+ "))
    ]


def test_bytes_outside_edited_lines_are_preserved(move_map):
    outcome = migrate_source(ODD_FORMATTING, move_map, package="app")
    after = outcome.new_source.decode()
    removed = [line[2:] for line in _changed_lines(ODD_FORMATTING, after) if line.startswith("- ")]
    assert removed == [
        "from sglang.srt.managers.mm_utils import (get_embedding_chunk ,\n",
        "        hash_feature)   # trailing\n",
        "\tfrom sglang.srt.managers.mm_utils import _is_hip\n",
    ]
    assert after == ODD_FORMATTING.replace(
        "from sglang.srt.managers.mm_utils import (get_embedding_chunk ,\n        hash_feature)   # trailing\n",
        "from sglang.srt.managers.mm_schedule import get_embedding_chunk\n"
        "from sglang.srt.managers.mm_utils import (hash_feature)   # trailing\n",
    ).replace("\tfrom sglang.srt.managers.mm_utils", "\tfrom sglang.srt.managers.mm_schedule")


def test_crlf_and_non_utf8_sources_round_trip(move_map):
    source = "# coding: latin-1\r\nname = '\xe9t\xe9'\r\nfrom sglang.srt.managers.mm_utils import _is_hip\r\n"
    raw = source.encode("latin-1")
    new = migrate_source(raw, move_map, package="app").new_source
    assert new == raw.replace(b"mm_utils", b"mm_schedule")


def _random_program(rng: random.Random, names: list[str]) -> str:
    lines = []
    for _ in range(rng.randint(1, 6)):
        chosen = rng.sample(names, rng.randint(1, 3))
        form = rng.choice(["from", "module", "local"])
        if form == "from":
            lines.append(f"from sglang.srt.managers.mm_utils import {', '.join(chosen)}")
        elif form == "module":
            lines.append("from sglang.srt.managers import mm_utils")
            lines.append(f"v{len(lines)} = [{', '.join('mm_utils.' + n for n in chosen)}]")
        else:
            lines.append(f"def f{len(lines)}():")
            lines.append(f"    from sglang.srt.managers.mm_utils import {', '.join(chosen)}")
            lines.append(f"    return {chosen[0]}")
    return "\n".join(lines) + "\n"


def test_random_programs_are_migrated_idempotently_and_completely(move_map):
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    names = ["get_embedding_chunk", "_is_hip", "hash_feature", "MultimodalDataItem",
             "general_mm_embed_routine", "_adjust_embedding_length", "get_embedding_and_mask"]
    moved_or_origin = set(move_map.moved) | set(move_map.import_origins)
    for _ in range(15):
        source = _random_program(rng, names)
        first = migrate_source(source, move_map, package="app")
        text = (first.new_source or source.encode()).decode()
        compile(text, "<migrated>", "exec")
        assert migrate_source(text, move_map, package="app").new_source is None, (seed, source)
        # Independent check with the stdlib ast: nothing moved is still taken from the old module.
        import ast

        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == move_map.old_module:
                assert not {a.name for a in node.names} & moved_or_origin, (seed, text)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "mm_utils":
                    assert node.attr not in moved_or_origin, (seed, text)


def test_gates_skip_files_that_cannot_need_work(move_map):
    gate = Gate.for_map(move_map)
    assert not gate.mentions(b"import os\n")
    staying = b"from sglang.srt.managers.mm_utils import general_mm_embed_routine\n"
    assert gate.mentions(staying) and not gate.needs_transform(staying, "app")
    other = b"from sglang.srt.multimodal.mm_utils import get_embedding_chunk\n"
    assert not gate.needs_transform(other, "app")
    moving = b"from sglang.srt.managers.mm_utils import get_embedding_chunk\n"
    assert gate.needs_transform(moving, "app")
    module = b"from sglang.srt.managers import mm_utils\nmm_utils._is_hip\n"
    assert gate.needs_transform(module, "app")
    assert gate.needs_transform(b"def broken(:\n  mm_utils", "app")  # libcst decides
