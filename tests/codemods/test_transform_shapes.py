"""Code shapes seen in downstream code and its tests, each before/after."""

from __future__ import annotations

from mm_schedule.codemods.findings import RULES
from mm_schedule.codemods.relevance import fork_warnings


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
