"""Code shapes seen in downstream code and its tests, each before/after."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from mm_schedule.codemods.rules import CODES as RULES
from mm_schedule.codemods.rules.fork import fork_warnings


def test_getattr_and_hasattr_follow_a_moved_name_like_setattr(check):
    findings = check(
        """
        from sglang.srt.managers import mm_utils
        fn = getattr(mm_utils, "get_embedding_chunk")
        ok = hasattr(mm_utils, "_get_multimodal_mask")
        setattr(mm_utils, "get_embedding_chunk", None)
        """,
        """
        from sglang.srt.managers import mm_schedule
        fn = getattr(mm_schedule, "get_embedding_chunk")
        ok = hasattr(mm_schedule, "_get_multimodal_mask")
        setattr(mm_schedule, "get_embedding_chunk", None)
        """,
        codes=["MMS001", "MMS002", "MMS001"],
    )
    assert all(f.fixed for f in findings)


def test_getattr_of_a_reexported_name_still_resolves_and_import_only_is_reported(check):
    source = """
        from sglang.srt.managers import mm_utils
        fn = getattr(mm_utils, "get_embedding_and_mask")
        cls = getattr(mm_utils, "MultimodalDataItem")
        """
    findings = check(source, source, codes=["MMS007"])
    assert findings[0].symbol == "MultimodalDataItem" and not findings[0].fixed


def test_suppression_comment_silences_named_codes_or_all(migrate):
    source = """
        from unittest import mock
        mock.patch("sglang.srt.managers.mm_utils.get_embedding_and_mask")  # mm-schedule-codemod: ignore[MMS005]
        mock.patch("sglang.srt.managers.mm_utils.init_mm_embedding_cache")  # mm-schedule-codemod: ignore[MMS007]
        mock.patch("sglang.srt.managers.mm_utils.MultimodalDataItem")  # mm-schedule-codemod: ignore
        """
    _, findings = migrate(source)
    assert [(f.line, f.code) for f in findings] == [(4, "MMS005")]


def test_fork_warning_names_the_old_modules_own_file(move_map):
    paths = [
        "fork/python/sglang/srt/managers/mm_utils.py",
        "fork/python/sglang/srt/multimodal/mm_utils.py",
        "fork/python/sglang/srt/managers/scheduler.py",
    ]
    warnings = fork_warnings(paths, move_map)
    assert [w.path for w in warnings] == [paths[0]]
    assert warnings[0].code == "MMS015" and "MMS015" in RULES and not warnings[0].fixed


def _ruff() -> str | None:
    """The ruff executable next to the installed ruff package, if any."""
    import shutil
    from pathlib import Path

    try:
        import ruff
    except ImportError:
        return shutil.which("ruff")
    for candidate in (Path(ruff.__file__).resolve().parents[4] / "bin" / "ruff", shutil.which("ruff")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


SORTED_BLOCKS = [
    # a split: the new module sorts before the old one
    """
    import os

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.mm_utils import get_embedding_chunk, hash_feature
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    print(os, TokenizedGenerateReqInput, get_embedding_chunk, hash_feature, ScheduleBatch)
    """,
    # an import-only name joins a later import of its origin; the statement keeps its place
    """
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.managers.mm_utils import MultimodalDataItem, get_embedding_chunk
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    print(TokenizedGenerateReqInput, MultimodalDataItem, get_embedding_chunk, ScheduleBatch)
    """,
    # names merged into an existing import keep isort's member order
    """
    from sglang.srt.managers.mm_schedule import PerImageRequestInfo, init_mm_embedding_cache
    from sglang.srt.managers.mm_utils import _is_hip, get_embedding_chunk, hash_feature

    print(PerImageRequestInfo, init_mm_embedding_cache, _is_hip, get_embedding_chunk, hash_feature)
    """,
    # a module binding added for the new module sorts before the old one
    """
    import sglang.srt.managers.mm_utils as mm_utils_mod

    print(mm_utils_mod.get_embedding_chunk, mm_utils_mod.hash_feature)
    """,
    # a long list stays wrapped
    """
    from sglang.srt.managers.mm_utils import (
        PerImageRequestInfo,
        get_embedding_chunk,
        hash_feature,
    )

    print(PerImageRequestInfo, get_embedding_chunk, hash_feature)
    """,
]


@pytest.mark.parametrize("before", SORTED_BLOCKS)
def test_new_imports_keep_a_sorted_block_sorted(migrate, before, tmp_path):
    """ruff's I001 passes on the input and still passes on the output."""
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed")

    def i001(text: str) -> subprocess.CompletedProcess:
        path = tmp_path / "block.py"
        path.write_text(text)
        return subprocess.run([ruff, "check", "--isolated", "--select", "I001", str(path)],
                              capture_output=True, text=True)

    source = textwrap.dedent(before)
    assert i001(source).returncode == 0, "the fixture itself must be sorted"
    after, findings = migrate(before)
    assert after != source and findings
    result = i001(after)
    assert result.returncode == 0, after + result.stdout


def test_comment_above_a_moved_name_moves_with_it(check):
    check(
        """
        from sglang.srt.managers.mm_utils import (
            # the chunk helper
            get_embedding_chunk,
            # stays behind
            hash_feature,
        )
        """,
        """
        from sglang.srt.managers.mm_schedule import (
            # the chunk helper
            get_embedding_chunk,
        )
        from sglang.srt.managers.mm_utils import (
            # stays behind
            hash_feature,
        )
        """,
        codes=["MMS001"],
    )


def test_optional_import_of_the_old_module_is_flagged(check):
    source = """
        try:
            import sglang.srt.managers.mm_utils as mmu
        except ImportError:
            mmu = None

        def chunk(x):
            if mmu is not None:
                return mmu.get_embedding_chunk(x)
            return mmu.hash_feature(x)
        """
    findings = check(source, source, codes=["MMS011"])
    assert findings[0].symbol == "get_embedding_chunk" and findings[0].line == 9


def test_old_version_branch_of_a_version_check_is_left_alone(check):
    check(
        """
        from sglang.srt.managers import mm_utils
        if SGLANG_VERSION >= (0, 5, 18):
            from sglang.srt.managers.mm_schedule import get_embedding_chunk
            mask = mm_utils._get_multimodal_mask
        elif sglang.__version__.startswith("0.4"):
            from sglang.srt.managers.mm_utils import get_embedding_chunk
        else:
            get_embedding_chunk = mm_utils.get_embedding_chunk
        """,
        """
        from sglang.srt.managers import mm_utils, mm_schedule
        if SGLANG_VERSION >= (0, 5, 18):
            from sglang.srt.managers.mm_schedule import get_embedding_chunk
            mask = mm_schedule._get_multimodal_mask
        elif sglang.__version__.startswith("0.4"):
            from sglang.srt.managers.mm_utils import get_embedding_chunk
        else:
            get_embedding_chunk = mm_utils.get_embedding_chunk
        """,
        codes=["MMS002"],
    )


def test_an_if_that_is_not_about_versions_is_migrated(check):
    check(
        """
        if USE_FAST:
            from sglang.srt.managers.mm_schedule import get_embedding_and_mask
        else:
            from sglang.srt.managers.mm_utils import get_embedding_chunk
        """,
        """
        if USE_FAST:
            from sglang.srt.managers.mm_schedule import get_embedding_and_mask
        else:
            from sglang.srt.managers.mm_schedule import get_embedding_chunk
        """,
        codes=["MMS001"],
    )


def test_patch_targets_built_from_a_module_constant_are_flagged(check):
    source = '''
        import sys
        from unittest import mock
        MM = "sglang.srt.managers.mm_utils"

        def test_it(monkeypatch):
            with mock.patch(f"{MM}.get_embedding_chunk"):
                pass
            mock.patch(MM + "._get_multimodal_mask")
            mock.patch("{}.{}".format(MM, "get_embedding_chunk"))
            monkeypatch.setattr(f"{MM}.get_embedding_chunk", None)
            mock.patch(f"{MM}.hash_feature")  # stays in the old module: nothing to say
            sys.modules["sglang.srt.managers.mm_utils"] = object()
            sys.modules[MM] = object()
        '''
    findings = check(source, source)
    assert [(f.line, f.code) for f in findings] == [
        (7, "MMS012"), (9, "MMS012"), (10, "MMS012"), (11, "MMS012"), (13, "MMS013"), (14, "MMS013"),
    ]


def test_sys_modules_stub_through_patch_dict_is_flagged(check):
    source = """
        import sys
        from unittest import mock
        mock.patch.dict(sys.modules, {"sglang.srt.managers.mm_utils": object()})
        """
    check(source, source, codes=["MMS013"])


def test_doctests_and_string_annotations_naming_moved_names_are_flagged(check):
    source = '''
        from sglang.srt.managers import mm_utils

        def chunk(info: "mm_utils.PerImageRequestInfo", x) -> "mm_utils.hash_feature":
            """Take one chunk.

            >>> from sglang.srt.managers.mm_utils import get_embedding_chunk
            >>> mm_utils.get_embedding_and_mask  # re-exported: still fine
            """
            return info
        '''
    findings = check(source, source)
    assert [(f.line, f.code, f.symbol) for f in findings] == [
        (4, "MMS014", "PerImageRequestInfo"), (7, "MMS014", "get_embedding_chunk"),
    ]


OLD = "sglang.srt.managers.mm_utils"
NEW = "sglang.srt.managers.mm_schedule"


PATCHES = """
    from unittest import mock
    from sglang.srt.managers import mm_utils
    mock.patch("sglang.srt.managers.mm_utils.get_embedding_and_mask")
    mock.patch.object(mm_utils, "init_mm_embedding_cache")
    """


@pytest.mark.parametrize(
    ("looked_up_in", "expected"),
    [
        # the callers read the name through the old module: the old patch still reaches them
        ({"get_embedding_and_mask": [OLD], "init_mm_embedding_cache": []}, []),
        ({"get_embedding_and_mask": [OLD, NEW], "init_mm_embedding_cache": [NEW]},
         [("get_embedding_and_mask", "as well"), ("init_mm_embedding_cache", f"patch {NEW}.init")]),
    ],
)
def test_advice_on_patching_a_reexported_name_follows_where_it_is_looked_up(move_map, looked_up_in, expected):
    from mm_schedule.codemods.engine.transform import migrate_source
    from mm_schedule.codemods.movemap.schema import MoveMap

    move_map = MoveMap.from_dict({**move_map.to_dict(), "looked_up_in": looked_up_in})
    outcome = migrate_source(textwrap.dedent(PATCHES), move_map, path="t.py", package="app")
    assert outcome.new_source is None
    got = [(f.symbol, f.message) for f in outcome.findings]
    assert [s for s, _ in got] == [s for s, _ in expected]
    for (_, message), (_, needle) in zip(got, expected):
        assert needle in message and all(f.code == "MMS005" and not f.fixed for f in outcome.findings)


def test_patching_get_embedding_and_mask_in_mm_utils_is_still_effective_with_the_shipped_map():
    """In SGLang 0.5.18 its caller, embed_mm_inputs, stayed in mm_utils and looks it up there."""
    from mm_schedule.codemods.engine.transform import migrate_source
    from mm_schedule.codemods.movemap.schema import load_map

    source = 'from unittest import mock\nmock.patch("sglang.srt.managers.mm_utils.get_embedding_and_mask")\n'
    outcome = migrate_source(source, load_map(), path="t.py", package="app")
    assert outcome.new_source is None and outcome.findings == []


def test_target_version_reports_names_gone_before_the_maps_range():
    from mm_schedule.codemods.engine.transform import migrate_source
    from mm_schedule.codemods.movemap.schema import load_map

    source = "from sglang.srt.managers.mm_utils import get_embedding_chunk_remove_extra_padding\n"
    assert migrate_source(source, load_map(target_version="0.5.9"), path="t.py").findings == []
    findings = migrate_source(source, load_map(), path="t.py").findings
    assert [f.code for f in findings] == ["MMS009"]
    assert "last in sglang 0.5.9 (gone since 0.5.10)" in findings[0].message
    # moved in the split, then dropped from the new module in 0.5.22: rewritten when aiming
    # at 0.5.21, reported (nothing to rewrite to) at the newest release
    private = "from sglang.srt.managers.mm_utils import _acknowledge_deferred_cuda_ipc_cache_hits\n"
    assert [f.code for f in migrate_source(private, load_map(target_version="0.5.21"),
                                           path="t.py").findings] == ["MMS002"]
    findings = migrate_source(private, load_map(), path="t.py").findings
    assert [f.code for f in findings] == ["MMS009"]
    assert "moved to sglang.srt.managers.mm_schedule, which had it last in sglang 0.5.21" in findings[0].message


def test_a_module_alias_for_the_new_module_reads_like_the_users_alias(check):
    """The binding added for the new module mirrors the user's alias, and every later use
    in the block reuses that one binding."""
    check(
        """
        import sglang.srt.managers.mm_utils as mm_utils_mod
        from sglang.srt.managers import mm_utils as _mm_utils
        x = mm_utils_mod.get_embedding_chunk, mm_utils_mod.hash_feature
        y = _mm_utils._is_hip, _mm_utils.hash_feature
        """,
        """
        import sglang.srt.managers.mm_schedule as mm_schedule_mod
        import sglang.srt.managers.mm_utils as mm_utils_mod
        from sglang.srt.managers import mm_utils as _mm_utils
        x = mm_schedule_mod.get_embedding_chunk, mm_utils_mod.hash_feature
        y = mm_schedule_mod._is_hip, _mm_utils.hash_feature
        """,
        codes=["MMS001", "MMS002"],
    )


def test_from_import_alias_of_the_old_module_gets_a_matching_alias(check):
    check(
        """
        from sglang.srt.managers import mm_utils as _mm_utils
        y = _mm_utils._is_hip, _mm_utils.hash_feature
        """,
        """
        from sglang.srt.managers import mm_utils as _mm_utils, mm_schedule as _mm_schedule
        y = _mm_schedule._is_hip, _mm_utils.hash_feature
        """,
        codes=["MMS002"],
    )


def test_the_old_module_kept_in_an_attribute_is_seen_where_it_is_read(move_map):
    from mm_schedule.codemods.engine.transform import migrate_source

    from .conftest import WHOLE

    source = (
        "from sglang.srt.managers import mm_utils\n"
        "class Runner:\n"
        "    def __init__(self):\n"
        "        self.mm = mm_utils\n"
        "    def step(self):\n"
        "        return self.mm.embedding_cache, self.mm.hash_feature, self.other.embedding_cache\n"
    )
    outcome = migrate_source(source, move_map, path="t.py")
    assert outcome.new_source is None  # not rewritten: which object self.mm holds is run-time
    assert [(f.line, f.column, f.code, f.symbol, f.fixed) for f in outcome.findings] == [
        (6, 16, "MMS007", "embedding_cache", False)]
    assert "self.mm holds sglang.srt.managers.mm_utils" in outcome.findings[0].message
    # the large-file path reports the same
    filler = "".join(f"def g{i}():\n    return {i}\n" for i in range(200))
    big = source + filler
    assert migrate_source(big, move_map, path="t.py", segment_above=1000).findings == \
        migrate_source(big, move_map, path="t.py", segment_above=WHOLE).findings
