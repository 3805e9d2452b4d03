"""From-imports of the old module: every form, every rule, and the negative controls."""

from __future__ import annotations

import textwrap

import pytest

from mm_schedule.codemods.engine.transform import migrate_source
from mm_schedule.codemods.movemap.schema import MoveMap


def test_all_names_moved_swaps_only_the_module(check):
    check(
        """
        import os  # untouched
        from sglang.srt.managers.mm_utils import get_embedding_chunk, PerImageRequestInfo as PIRI
        x = get_embedding_chunk(PIRI)
        """,
        """
        import os  # untouched
        from sglang.srt.managers.mm_schedule import get_embedding_chunk, PerImageRequestInfo as PIRI
        x = get_embedding_chunk(PIRI)
        """,
        codes=["MMS001", "MMS001"],
    )


def test_mixed_statement_is_split_keeping_aliases_and_comments(check):
    check(
        """
        from sglang.srt.managers.mm_utils import (
            general_mm_embed_routine,  # stays
            _get_multimodal_mask as mask_of,  # private, moves
            hash_feature
        )
        """,
        """
        from sglang.srt.managers.mm_schedule import (
            _get_multimodal_mask as mask_of,  # private, moves
        )
        from sglang.srt.managers.mm_utils import (
            general_mm_embed_routine,  # stays
            hash_feature
        )
        """,
        codes=["MMS002"],
    )


def test_moved_names_merge_into_an_earlier_import_of_the_new_module(check):
    check(
        """
        from sglang.srt.managers.mm_schedule import get_embedding_and_mask
        from sglang.srt.managers.mm_utils import _get_multimodal_mask
        from sglang.srt.managers.mm_utils import hash_feature, _is_hip as hip  # noqa: F401
        """,
        """
        from sglang.srt.managers.mm_schedule import (
            _get_multimodal_mask,
            _is_hip as hip,
            get_embedding_and_mask,
        )
        from sglang.srt.managers.mm_utils import hash_feature  # noqa: F401
        """,
        codes=["MMS002", "MMS002"],
    )


def test_import_with_a_comment_is_not_merged_away(check):
    check(
        """
        from sglang.srt.managers.mm_schedule import get_embedding_and_mask
        # the chunk helper
        from sglang.srt.managers.mm_utils import get_embedding_chunk
        """,
        """
        from sglang.srt.managers.mm_schedule import get_embedding_and_mask
        # the chunk helper
        from sglang.srt.managers.mm_schedule import get_embedding_chunk
        """,
    )


def test_function_local_import_is_edited_in_place_never_hoisted(check):
    check(
        """
        import os


        def encode():
            from sglang.srt.managers.mm_utils import hash_feature, get_embedding_chunk
            return get_embedding_chunk(hash_feature)
        """,
        """
        import os


        def encode():
            from sglang.srt.managers.mm_schedule import get_embedding_chunk
            from sglang.srt.managers.mm_utils import hash_feature
            return get_embedding_chunk(hash_feature)
        """,
    )


def test_type_checking_imports_stay_type_checking_only(check):
    check(
        """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from sglang.srt.managers.mm_utils import PerImageRequestInfo, hash_feature
        if TYPE_CHECKING: from sglang.srt.managers.mm_utils import hash_feature, _is_hip
        """,
        """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from sglang.srt.managers.mm_schedule import PerImageRequestInfo
            from sglang.srt.managers.mm_utils import hash_feature
        if TYPE_CHECKING: from sglang.srt.managers.mm_utils import hash_feature; from sglang.srt.managers.mm_schedule import _is_hip
        """,
    )


def test_compatible_try_except_shim_is_left_alone(check):
    source = """
        try:
            from sglang.srt.managers.mm_schedule import _get_multimodal_mask
        except ImportError:
            from sglang.srt.managers.mm_utils import _get_multimodal_mask
        """
    assert check(source, source) == []


def test_try_block_import_with_fallback_is_edited_in_place(check):
    check(
        """
        try:
            from sglang.srt.managers.mm_utils import _adjust_embedding_length
        except ImportError:
            _adjust_embedding_length = None
        """,
        """
        try:
            from sglang.srt.managers.mm_schedule import _adjust_embedding_length
        except ImportError:
            _adjust_embedding_length = None
        """,
    )


def test_relative_imports_resolve_against_the_package(check):
    check(
        """
        from .mm_utils import get_embedding_chunk, hash_feature
        from ..managers.mm_utils import _is_hip
        """,
        """
        from .mm_utils import hash_feature
        from .mm_schedule import get_embedding_chunk
        from ..managers.mm_schedule import _is_hip
        """,
        package="sglang.srt.managers",
    )


def test_relative_import_from_another_package_becomes_absolute_when_needed(check):
    check(
        """
        from ..managers.mm_utils import MultimodalDataItem
        """,
        """
        from ..managers.schedule_batch import MultimodalDataItem
        """,
        package="sglang.srt.models",
        codes=["MMS003"],
    )


def test_modules_sharing_the_basename_are_never_touched(migrate):
    source = '''
        """Docstring: sglang.srt.managers.mm_utils.get_embedding_chunk moved."""
        # comment: from sglang.srt.managers.mm_utils import get_embedding_chunk
        from .mm_utils import get_embedding_chunk
        from . import mm_utils
        from sglang.srt.multimodal.mm_utils import get_embedding_chunk as g
        from sglang.srt.distributed.vmm_utils import get_embedding_chunk as v
        from sglang.srt.models.phi4mm_utils import _is_hip
        import mm_utils as local
        x = mm_utils.get_embedding_chunk(1) + local.get_embedding_chunk() + g + v + _is_hip


        def f():
            """sglang.srt.managers.mm_utils._get_multimodal_mask"""
        '''
    text, findings = migrate(source, package="sglang.srt.multimodal")
    assert text == textwrap.dedent(source)
    assert findings == []


def test_unresolvable_relative_import_is_not_guessed(migrate):
    source = "from .mm_utils import get_embedding_chunk\n"
    assert migrate(source, package=None) == (source, [])


def test_import_only_names_go_to_their_origin_and_are_reported(check):
    findings = check(
        "from sglang.srt.managers.mm_utils import MultimodalDataItem, _is_hip\n",
        "from sglang.srt.managers.mm_schedule import _is_hip\n"
        "from sglang.srt.managers.schedule_batch import MultimodalDataItem\n",
        codes=["MMS003", "MMS002"],
    )
    assert all(f.fixed for f in findings)
    assert "schedule_batch" in findings[0].message


def test_removed_and_unmapped_names_are_reported_not_edited(check):
    source = "from sglang.srt.managers.mm_utils import old_helper, np, hash_feature\n"
    findings = check(source, source, codes=["MMS009", "MMS010"])
    assert not any(f.fixed for f in findings)
    assert "import numpy as np" in findings[1].message


def test_star_import_relying_on_moved_names_is_reported(check):
    source = """
        from sglang.srt.managers.mm_utils import *
        x = get_embedding_chunk(1) + general_mm_embed_routine()
        __all__ = ["_is_hip"]
        """
    (finding,) = check(source, source, codes=["MMS006"])
    assert finding.symbol == "_is_hip,get_embedding_chunk" and not finding.fixed


def test_star_import_of_staying_names_only_is_quiet(check):
    source = """
        from sglang.srt.managers.mm_utils import *
        x = general_mm_embed_routine()
        """
    assert check(source, source) == []


def test_rebound_global_from_import_becomes_module_attribute_access(check):
    check(
        """
        from sglang.srt.managers.mm_utils import embedding_cache, hash_feature


        def lookup(key):
            return embedding_cache.get(key)
        """,
        """
        from sglang.srt.managers import mm_schedule
        from sglang.srt.managers.mm_utils import hash_feature


        def lookup(key):
            return mm_schedule.embedding_cache.get(key)
        """,
        codes=["MMS004"],
    )


def test_rebound_global_imported_from_the_new_module_is_fixed_too(check):
    check(
        """
        def lookup(key):
            from sglang.srt.managers.mm_schedule import embedding_cache as cache
            return (cache).get(key)
        """,
        """
        def lookup(key):
            from sglang.srt.managers import mm_schedule
            return (mm_schedule.embedding_cache).get(key)
        """,
        codes=["MMS004"],
    )


def test_rebound_global_that_is_reassigned_or_exported_is_flagged_only(check):
    findings = check(
        """
        from sglang.srt.managers.mm_utils import embedding_cache
        __all__ = ["embedding_cache"]
        """,
        """
        from sglang.srt.managers.mm_schedule import embedding_cache
        __all__ = ["embedding_cache"]
        """,
    )
    assert [(f.code, f.fixed) for f in findings] == [("MMS001", True), ("MMS004", False)]
    source = """
        def f():
            from sglang.srt.managers.mm_schedule import embedding_cache
            embedding_cache = None
            return embedding_cache
        """
    findings = check(source, source)
    assert [(f.code, f.fixed) for f in findings] == [("MMS004", False)]


def test_findings_carry_path_line_column_and_symbol(migrate):
    _, findings = migrate("import os\nfrom sglang.srt.managers.mm_utils import (\n    _is_hip,\n)\n")
    (finding,) = findings
    assert (finding.path, finding.line, finding.column) == ("t.py", 3, 5)
    assert (finding.code, finding.symbol, finding.fixed) == ("MMS002", "_is_hip", True)


def test_another_split_works_from_its_map_alone():
    other = MoveMap.from_dict({
        "old_module": "acme.util",
        "new_module": "acme.core.io",
        "moved": {"read_all": {"kind": "function", "private": False}},
        "reexported": [],
        "import_origins": {},
        "rebound_globals": [],
    })
    source = "from acme.util import read_all, other\nfrom acme import util\nutil.read_all()\n"
    outcome = migrate_source(source, other, package="app")
    assert outcome.new_source.decode() == (
        "from acme.util import other\nfrom acme.core.io import read_all\n"
        "from acme.core import io\nio.read_all()\n"
    )


@pytest.mark.parametrize("line_end, other", [(b"\n", b"\r\n"), (b"\r\n", b"\n")])
def test_a_split_line_keeps_its_own_line_end_in_a_mixed_file(move_map, line_end, other):
    source = (b"import os" + other + b"from sglang.srt.managers.mm_utils import get_embedding_chunk, "
              b"hash_feature" + line_end + b"x = 1" + other)
    new = migrate_source(source, move_map, path="t.py").new_source
    assert new == (b"import os" + other + b"from sglang.srt.managers.mm_schedule import get_embedding_chunk"
                   + line_end + b"from sglang.srt.managers.mm_utils import hash_feature" + line_end
                   + b"x = 1" + other)
