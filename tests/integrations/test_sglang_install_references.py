"""Every reference a loaded module holds to SGLang's ``mm_schedule`` or its functions is
rebound by ``install()`` or named in its report; ``uninstall()`` restores exactly what
``install()`` changed; concurrent calls are safe."""

from __future__ import annotations

import functools
import sys
import threading
import types

import pytest

from mm_schedule.integrations.sglang import install, installed, standin, uninstall
from mm_schedule.integrations.sglang.versions import NEWEST

pytestmark = pytest.mark.realworld

MODULE = "sglang.srt.managers.mm_schedule"


@pytest.fixture
def engine(sglang_releases):
    sglang = sglang_releases(NEWEST)
    added: list[str] = []

    def plugin(name: str, **attrs):
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        for value in attrs.values():
            if isinstance(value, type):
                value.__module__ = name
        sys.modules[name] = module
        added.append(name)
        return module

    with sglang:
        try:
            yield sglang.scheduler, plugin
        finally:
            uninstall()
            for name in added:
                sys.modules.pop(name, None)
            standin.embedding_cache = None
            standin.set_step_context(None)


def test_module_objects_class_attributes_and_registries_are_rebound(engine):
    theirs, plugin = engine

    class Hooks:
        embed = theirs.get_embedding_and_mask
        chunk = staticmethod(theirs.get_embedding_chunk)
        scheduler = theirs

    fork = plugin("fork_plugin", mms=theirs, Hooks=Hooks,
                  REGISTRY={"embed": theirs.get_embedding_and_mask, "other": len},
                  PIPELINE=[theirs._get_chunked_prefill_embedding, print],
                  FROZEN=(theirs.get_embedding_and_mask,),
                  BOUND=functools.partial(theirs.get_embedding_chunk, extend_prefix_len=0))
    report = install()
    assert fork.mms is standin and Hooks.scheduler is standin
    assert Hooks.embed is standin.get_embedding_and_mask
    assert Hooks.__dict__["chunk"].__func__ is standin.get_embedding_chunk
    assert fork.REGISTRY == {"embed": standin.get_embedding_and_mask, "other": len}
    assert fork.PIPELINE == [standin._get_chunked_prefill_embedding, print]
    assert {"fork_plugin.mms", "fork_plugin.Hooks.embed", "fork_plugin.Hooks.chunk", "fork_plugin.Hooks.scheduler",
            "fork_plugin.REGISTRY['embed']", "fork_plugin.PIPELINE[0]"} <= set(report.rebound)
    # What cannot be replaced in place is named, and stays SGLang's.
    assert fork.FROZEN == (theirs.get_embedding_and_mask,) and fork.BOUND.func is theirs.get_embedding_chunk
    assert any(r.startswith("fork_plugin.FROZEN") for r in report.reported)
    assert any(r.startswith("fork_plugin.BOUND") for r in report.reported)

    assert uninstall()
    assert fork.mms is theirs and Hooks.scheduler is theirs and Hooks.embed is theirs.get_embedding_and_mask
    assert Hooks.__dict__["chunk"].__func__ is theirs.get_embedding_chunk
    assert fork.REGISTRY == {"embed": theirs.get_embedding_and_mask, "other": len}
    assert fork.PIPELINE == [theirs._get_chunked_prefill_embedding, print]


def test_uninstall_leaves_a_wrapper_set_after_install(engine):
    theirs, plugin = engine
    fork = plugin("fork_wrapped", embed=theirs.get_embedding_and_mask, registry={"embed": theirs.get_embedding_and_mask})
    mm_utils = sys.modules["sglang.srt.managers.mm_utils"]
    install()

    def wrapper(*args, **kwargs):
        return standin.get_embedding_and_mask(*args, **kwargs)

    mm_utils.get_embedding_and_mask = wrapper
    fork.registry["embed"] = wrapper
    try:
        uninstall()
        assert mm_utils.get_embedding_and_mask is wrapper and fork.registry["embed"] is wrapper
        assert fork.embed is theirs.get_embedding_and_mask  # untouched since install: restored
    finally:
        mm_utils.get_embedding_and_mask = theirs.get_embedding_and_mask  # the loaded release is shared


def test_a_module_imported_while_installed_is_restored(engine):
    theirs, plugin = engine
    install()
    from sglang.srt.managers import mm_schedule as imported_module

    late = plugin("late_plugin", mms=imported_module, embed=imported_module.get_embedding_and_mask, other=len)
    assert late.mms is standin
    uninstall()
    assert late.mms is theirs and late.embed is theirs.get_embedding_and_mask and late.other is len
    assert sys.modules[MODULE] is theirs


def test_concurrent_installs_and_uninstalls_leave_nothing_behind(engine):
    theirs, plugin = engine
    fork = plugin("fork_threads", embed=theirs.get_embedding_and_mask, mms=theirs)
    mm_utils = sys.modules["sglang.srt.managers.mm_utils"]
    barrier = threading.Barrier(8)
    reports, errors = [], []

    def worker(k: int):
        try:
            barrier.wait()
            for _ in range(3):
                if k % 2:
                    reports.append(install())
                else:
                    uninstall()
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    if installed():
        assert fork.embed is standin.get_embedding_and_mask and sys.modules[MODULE] is standin
    uninstall()
    assert not installed()
    assert fork.embed is theirs.get_embedding_and_mask and fork.mms is theirs
    assert mm_utils.get_embedding_and_mask is theirs.get_embedding_and_mask
    assert sys.modules[MODULE] is theirs and sys.modules["sglang.srt.managers"].mm_schedule is theirs
    # Two installs at once give one installation, and one report.
    barrier = threading.Barrier(2)
    got = []

    def install_once():
        barrier.wait()
        got.append(install())

    pair = [threading.Thread(target=install_once) for _ in range(2)]
    for t in pair:
        t.start()
    for t in pair:
        t.join(timeout=60)
    assert len(got) == 2 and got[0] is got[1]
    uninstall()
    assert fork.embed is theirs.get_embedding_and_mask and mm_utils.mm_schedule is theirs
