"""An SGLang release the stand-in does not know is verified where it is loaded, not
refused: SGLang's module (the newest known release's, from its wheel, presented as a
newer build) installs with one warning when its names, parameters and behaviour agree
with the stand-in, and is refused naming the first difference when one function's
parameters or behaviour differ."""

from __future__ import annotations

import logging
import sys
import time

import pytest
import torch

from mm_schedule.integrations.sglang import (
    UnsupportedSGLangVersion,
    install,
    installed,
    standin,
    uninstall,
)
from mm_schedule.integrations.sglang import verify as verifier
from mm_schedule.integrations.sglang.versions import NEWEST, nearest, version_key

pytestmark = pytest.mark.realworld

MODULE = "sglang.srt.managers.mm_schedule"
LOGGER = "mm_schedule.integrations.sglang.install"


@pytest.fixture
def engine(sglang_releases):
    sglang = sglang_releases(NEWEST)
    with sglang:
        sys.modules["sglang"].__version__ = "0.5.24.dev3+fork"
        try:
            yield sglang
        finally:
            uninstall()
            standin.use_release(NEWEST)
            standin.embedding_cache = None


def test_versions_sort_numerically_and_unknown_ones_take_the_nearest_older_release():
    assert version_key("0.5.10") > version_key("0.5.9")
    assert nearest("0.5.24.dev3+fork") == nearest("0.6.0") == NEWEST
    assert nearest("0.5.20") == "0.5.20" and nearest("0.5.21rc1") == "0.5.21"
    assert nearest("0.4.0") == "0.5.18"


def test_an_unknown_release_that_agrees_installs_with_one_warning(engine, caplog):
    theirs = engine.scheduler
    theirs.init_mm_embedding_cache(4321)
    kept = theirs.embedding_cache
    with caplog.at_level(logging.INFO, logger=LOGGER):
        started = time.perf_counter()
        report = install()
        took = time.perf_counter() - started
    assert installed() and sys.modules[MODULE] is standin
    assert report.version == "0.5.24.dev3+fork" and report.release == NEWEST
    assert report.verified and "agree" in report.verified
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "0.5.24.dev3+fork" in warnings[0].getMessage()
    assert took < 2.0
    # The probe left SGLang's own cache as it was, and its size carried over.
    assert theirs.embedding_cache is kept and report.cache_size == 4321


def test_the_probe_agrees_with_every_known_release(sglang, standin):
    standin.use_release(sglang.version)
    assert verifier.surface_differences(sglang.scheduler, standin) == []
    assert verifier.probe_differences(sglang.scheduler, standin) == []


def _refused(engine, match: str):
    theirs = engine.scheduler
    with pytest.raises(UnsupportedSGLangVersion, match=match) as caught:
        install()
    assert not installed() and sys.modules[MODULE] is theirs and standin.release() == NEWEST
    return str(caught.value)


def test_a_function_with_other_parameters_is_refused_by_name(engine, monkeypatch):
    theirs = engine.scheduler
    original = theirs._get_chunked_embedding_by_item

    def changed(data_embedding_func, embedding_items_per_req, extend_prefix_len, extend_seq_len, device,
                stream=None):
        return original(data_embedding_func, embedding_items_per_req, extend_prefix_len, extend_seq_len, device)

    changed.__module__ = theirs.__name__
    monkeypatch.setattr(theirs, "_get_chunked_embedding_by_item", changed)
    message = _refused(engine, r"0\.5\.24\.dev3\+fork .* as SGLang 0\.5\.23")
    assert "_get_chunked_embedding_by_item(" in message and "stream=None" in message


def test_a_name_the_stand_in_lacks_is_refused_by_name(engine, monkeypatch):
    theirs = engine.scheduler

    def _encode_on_side_stream(items):
        return items

    _encode_on_side_stream.__module__ = theirs.__name__
    monkeypatch.setattr(theirs, "_encode_on_side_stream", _encode_on_side_stream, raising=False)
    _refused(engine, r"it has _encode_on_side_stream, which the stand-in lacks")


def test_a_function_that_behaves_otherwise_is_refused_by_the_probe(engine, monkeypatch):
    theirs = engine.scheduler
    original = theirs.get_embedding_and_mask

    def get_embedding_and_mask(data_embedding_func, embedding_items, placeholder_tensor, input_ids, items_size,
                               prefix_length, extend_length, items_offset_list):
        rows, mask, ids = original(data_embedding_func, embedding_items, placeholder_tensor, input_ids, items_size,
                                   prefix_length, extend_length, items_offset_list)
        return (torch.flip(rows, [0]) if rows is not None else rows), mask, ids

    get_embedding_and_mask.__module__ = theirs.__name__
    monkeypatch.setattr(theirs, "get_embedding_and_mask", get_embedding_and_mask)
    _refused(engine, r"probe step 0 .*returned other rows")


def test_an_unknown_release_whose_module_cannot_be_imported_is_refused(engine):
    saved = sys.modules.pop(MODULE)
    try:
        with pytest.raises(UnsupportedSGLangVersion, match="could not be imported to verify it"):
            install()
    finally:
        sys.modules[MODULE] = saved
    assert not installed()
