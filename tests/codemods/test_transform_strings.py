"""String targets of patch helpers, dynamic access, path loaders."""

from __future__ import annotations


def test_mock_patch_string_of_a_moved_name_is_rewritten_keeping_quotes(check):
    check(
        """
        from unittest import mock
        @mock.patch('sglang.srt.managers.mm_utils._get_multimodal_mask.__call__')
        @mock.patch("sglang.srt.managers.mm_utils.hash_feature")
        def test(a, b, mocker):
            mocker.patch(target="sglang.srt.managers.mm_utils.get_embedding_chunk")
        """,
        """
        from unittest import mock
        @mock.patch('sglang.srt.managers.mm_schedule._get_multimodal_mask.__call__')
        @mock.patch("sglang.srt.managers.mm_utils.hash_feature")
        def test(a, b, mocker):
            mocker.patch(target="sglang.srt.managers.mm_schedule.get_embedding_chunk")
        """,
        codes=["MMS002", "MMS001"],
    )


def test_patches_at_the_old_lookup_site_are_reported_not_edited(check):
    source = """
        from unittest.mock import patch
        @patch("sglang.srt.managers.mm_utils.get_embedding_and_mask")
        @patch("sglang.srt.managers.mm_utils.MultimodalDataItem")
        def test(a, b):
            pass
        """
    findings = check(source, source, codes=["MMS005", "MMS005"])
    assert "re-export" in findings[0].message and not findings[0].fixed


def test_object_forms_rewrite_the_module_object(check):
    check(
        """
        from sglang.srt.managers import mm_utils
        def test(monkeypatch, mocker):
            monkeypatch.setattr(mm_utils, "_is_hip", True)
            mocker.patch.object(mm_utils, "_adjust_embedding_length")
            monkeypatch.setattr("sglang.srt.managers.mm_utils._is_hip", False)
            mm_utils.hash_feature()
        """,
        """
        from sglang.srt.managers import mm_utils, mm_schedule
        def test(monkeypatch, mocker):
            monkeypatch.setattr(mm_schedule, "_is_hip", True)
            mocker.patch.object(mm_schedule, "_adjust_embedding_length")
            monkeypatch.setattr("sglang.srt.managers.mm_schedule._is_hip", False)
            mm_utils.hash_feature()
        """,
        codes=["MMS002", "MMS002", "MMS002"],
    )


def test_patch_object_of_a_reexported_name_is_reported(check):
    source = """
        from unittest import mock
        from sglang.srt.managers import mm_utils
        with mock.patch.object(mm_utils, "get_embedding_and_mask"):
            pass
        """
    check(source, source, codes=["MMS005"])


def test_patch_multiple_moves_when_every_name_moved(check):
    check(
        """
        @mock.patch.multiple("sglang.srt.managers.mm_utils", _is_hip=True, get_embedding_chunk=None)
        def test():
            pass
        """,
        """
        @mock.patch.multiple("sglang.srt.managers.mm_schedule", _is_hip=True, get_embedding_chunk=None)
        def test():
            pass
        """,
    )
    source = """
        @mock.patch.multiple("sglang.srt.managers.mm_utils", _is_hip=True, hash_feature=None)
        def test():
            pass
        """
    check(source, source, codes=["MMS005"])


def test_dynamic_access_is_reported_not_edited(check):
    source = """
        import importlib
        from sglang.srt.managers import mm_utils
        module = importlib.import_module("sglang.srt.managers.mm_utils")
        name = "sglang.srt.managers.mm_utils.get_embedding_chunk"
        loader = spec_from_file_location("m", "/x/sglang/srt/managers/mm_utils.py")
        module.get_embedding_chunk
        """
    findings = check(source, source)
    assert [f.code for f in findings] == ["MMS007", "MMS007", "MMS008"]
    assert not any(f.fixed for f in findings)


def test_strings_in_docstrings_and_other_calls_are_not_edited(check):
    source = '''
        def f():
            """Patch sglang.srt.managers.mm_utils.get_embedding_chunk here."""
            log("sglang.srt.multimodal.mm_utils.get_embedding_chunk")
        '''
    assert check(source, source) == []
