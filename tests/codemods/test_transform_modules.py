"""``import M [as x]`` / ``from pkg import mm_utils [as x]`` followed by ``x.name``."""

from __future__ import annotations


def test_module_import_whose_uses_all_moved_is_retargeted(check):
    check(
        """
        from sglang.srt.managers import mm_utils


        def test():
            return mm_utils.get_embedding_chunk(), mm_utils.PerImageRequestInfo
        """,
        """
        from sglang.srt.managers import mm_schedule


        def test():
            return mm_schedule.get_embedding_chunk(), mm_schedule.PerImageRequestInfo
        """,
        codes=["MMS001", "MMS001"],
    )


def test_user_alias_is_kept_when_the_whole_import_moves(check):
    check(
        """
        import sglang.srt.managers.mm_utils as mmu
        mmu._is_hip
        """,
        """
        import sglang.srt.managers.mm_schedule as mmu
        mmu._is_hip
        """,
    )


def test_mixed_uses_get_a_new_binding_next_to_the_old_one(check):
    check(
        """
        from sglang.srt.managers import mm_utils
        x = mm_utils.general_mm_embed_routine(mm_utils._get_multimodal_mask)
        """,
        """
        from sglang.srt.managers import mm_utils, mm_schedule
        x = mm_utils.general_mm_embed_routine(mm_schedule._get_multimodal_mask)
        """,
    )


def test_new_binding_alias_avoids_names_in_use(check):
    check(
        """
        import sglang.srt.managers.mm_utils as mmu
        mm_schedule = "taken"
        mmu.hash_feature(mmu.get_embedding_chunk)
        """,
        """
        import sglang.srt.managers.mm_schedule as mm_schedule_1
        import sglang.srt.managers.mm_utils as mmu
        mm_schedule = "taken"
        mmu.hash_feature(mm_schedule_1.get_embedding_chunk)
        """,
    )


def test_dotted_import_uses_are_rewritten_dotted(check):
    check(
        """
        import sglang.srt.managers.mm_utils
        sglang.srt.managers.mm_utils.hash_feature(sglang.srt.managers.mm_utils._is_hip)
        """,
        """
        import sglang.srt.managers.mm_schedule
        import sglang.srt.managers.mm_utils
        sglang.srt.managers.mm_utils.hash_feature(sglang.srt.managers.mm_schedule._is_hip)
        """,
    )


def test_function_local_module_import_gets_a_function_local_binding(check):
    check(
        """
        import os


        def f():
            from sglang.srt.managers import mm_utils
            return mm_utils.hash_feature, mm_utils._get_multimodal_mask, mm_utils.MultimodalDataItem
        """,
        """
        import os


        def f():
            from sglang.srt.managers import mm_utils, mm_schedule, schedule_batch
            return mm_utils.hash_feature, mm_schedule._get_multimodal_mask, schedule_batch.MultimodalDataItem
        """,
        codes=["MMS002", "MMS003"],
    )


def test_relative_module_import(check):
    check(
        """
        from . import mm_utils
        mm_utils.hash_feature(mm_utils.get_embedding_chunk)
        """,
        """
        from . import mm_utils, mm_schedule
        mm_utils.hash_feature(mm_schedule.get_embedding_chunk)
        """,
        package="sglang.srt.managers",
    )


def test_old_import_left_unused_by_the_rewrite_is_dropped(check):
    check(
        """
        from sglang.srt.managers import mm_utils, schedule_batch
        mm_utils._is_hip = True
        mm_utils.get_embedding_chunk(schedule_batch)
        """,
        """
        from sglang.srt.managers import schedule_batch, mm_schedule
        mm_schedule._is_hip = True
        mm_schedule.get_embedding_chunk(schedule_batch)
        """,
    )


def test_assignment_to_a_reexported_name_at_the_old_site_is_reported(check):
    source = """
        from sglang.srt.managers import mm_utils
        mm_utils.get_embedding_and_mask = fake
        mm_utils.MultimodalDataItem = fake
        """
    findings = check(source, source, codes=["MMS005", "MMS005"])
    assert not any(f.fixed for f in findings)


def test_shim_binding_two_modules_to_one_name_is_left_alone(check):
    source = """
        try:
            from sglang.srt.managers import mm_schedule as mm
        except ImportError:
            from sglang.srt.managers import mm_utils as mm
        mm._get_multimodal_mask()
        """
    assert check(source, source) == []


def test_a_rebound_local_name_is_not_the_module(check):
    source = """
        from sglang.srt.managers import mm_utils
        mm_utils = object()
        mm_utils.get_embedding_chunk()
        """
    check(source, source)
