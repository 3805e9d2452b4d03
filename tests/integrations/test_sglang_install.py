"""``install()`` / ``uninstall()`` in a process where one SGLang release's real modules are
loaded (from its wheel, heavy imports stubbed; each known release in turn), and that
release's own ``embed_mm_inputs`` giving bit-identical ``input_embeds`` with and without
the stand-in installed."""

from __future__ import annotations

import importlib
import logging
import sys
import types

import pytest
import torch

from mm_schedule.integrations.sglang import install, installed, standin, uninstall
from tests.integrations.conftest import _process_module

pytestmark = pytest.mark.realworld

MODULE = "sglang.srt.managers.mm_schedule"
HIDDEN = 8
VOCAB = 128
proc = _process_module()
parity = importlib.import_module("run_sglang_embed_parity")  # benchmarks/, on the path once proc is loaded
Item, Modality = proc.MultimodalDataItem, proc.Modality
PADS = {Modality.IMAGE: 99, Modality.VIDEO: 98}


@pytest.fixture
def engine(sglang):
    """SGLang's modules registered in ``sys.modules``; a fork module that took names at
    import; nothing installed before or after."""
    with sglang:
        fork = types.ModuleType("downstream_fork.mm")
        fork.full = sglang.scheduler._get_chunked_embedding_full  # ``from ... import x as full``
        fork.not_sglangs = len
        sys.modules[fork.__name__] = fork
        try:
            yield sglang, fork
        finally:
            uninstall()
            sys.modules.pop(fork.__name__, None)
            standin.embedding_cache = None
            standin.set_step_context(None)


def test_install_replaces_the_module_and_every_name_bound_at_import(engine, caplog):
    sglang, fork = engine
    theirs = sglang.scheduler
    builder = sys.modules["sglang.srt.mem_cache.kv_cache_builder"]
    mm_utils = sys.modules["sglang.srt.managers.mm_utils"]
    assert mm_utils.get_embedding_and_mask is theirs.get_embedding_and_mask
    with caplog.at_level(logging.INFO, logger="mm_schedule.integrations.sglang.install"):
        report = install()
    assert installed() and report.version == sglang.version and report.replaced_module
    assert report.release == standin.release() == sglang.version and report.verified is None
    assert sys.modules[MODULE] is standin and sys.modules["sglang.srt.managers"].mm_schedule is standin
    assert mm_utils.get_embedding_and_mask is standin.get_embedding_and_mask
    assert mm_utils.init_mm_embedding_cache is standin.init_mm_embedding_cache
    assert mm_utils.DataEmbeddingFunc is standin.DataEmbeddingFunc
    assert builder.init_mm_embedding_cache is standin.init_mm_embedding_cache
    assert fork.full is standin._get_chunked_embedding_full and fork.not_sglangs is len
    assert {"sglang.srt.managers.mm_utils.get_embedding_and_mask",
            "sglang.srt.mem_cache.kv_cache_builder.init_mm_embedding_cache",
            "downstream_fork.mm.full"} <= set(report.rebound)
    assert mm_utils.torch is torch and theirs.torch is torch  # names SGLang imported from elsewhere stay
    message = " ".join(r.getMessage() for r in caplog.records)
    assert f"SGLang {sglang.version}" in message and "downstream_fork.mm.full" in message
    if hasattr(mm_utils, "mm_schedule"):  # 0.5.21+: mm_utils holds the module object
        assert mm_utils.mm_schedule is standin and "sglang.srt.managers.mm_utils.mm_schedule" in report.rebound

    # Idempotent: a second call changes nothing and reports the same.
    assert install() is report
    assert mm_utils.get_embedding_and_mask is standin.get_embedding_and_mask

    assert uninstall() and not installed()
    assert sys.modules[MODULE] is theirs and sys.modules["sglang.srt.managers"].mm_schedule is theirs
    assert mm_utils.get_embedding_and_mask is theirs.get_embedding_and_mask
    assert getattr(mm_utils, "mm_schedule", theirs) is theirs
    assert builder.init_mm_embedding_cache is theirs.init_mm_embedding_cache
    assert fork.full is theirs._get_chunked_embedding_full
    assert uninstall() is False


def test_installed_before_sglang_imports_its_module(engine):
    sglang, _ = engine
    del sys.modules[MODULE]
    try:
        report = install()
        assert not report.replaced_module and report.rebound == []
        from sglang.srt.managers import mm_schedule

        assert mm_schedule is standin and sys.modules[MODULE] is standin
        uninstall()
        assert MODULE not in sys.modules
    finally:
        sys.modules[MODULE] = sglang.scheduler


def test_a_cache_sglang_made_is_carried_over_with_its_size(engine):
    sys.modules["sglang.srt.mem_cache.kv_cache_builder"].init_mm_embedding_cache(12345)
    report = install()
    assert report.cache_size == 12345 and standin.embedding_cache.max_bytes == 12345
    # The engine's later call goes to the stand-in.
    sys.modules["sglang.srt.mem_cache.kv_cache_builder"].init_mm_embedding_cache(777)
    assert standin.embedding_cache.max_bytes == 777


def test_the_tp_group_comes_from_sglangs_parallel_state(engine, monkeypatch):
    cpu_group, device_group = object(), object()
    parallel_state = types.ModuleType("sglang.srt.distributed.parallel_state")
    parallel_state.get_tp_group = lambda: types.SimpleNamespace(cpu_group=cpu_group, device_group=device_group)
    monkeypatch.setitem(sys.modules, "sglang.srt.distributed", types.ModuleType("sglang.srt.distributed"))
    monkeypatch.setitem(sys.modules, parallel_state.__name__, parallel_state)
    sys.modules["sglang.srt.distributed"].parallel_state = parallel_state
    install()
    with proc.PARALLEL.override(attn_tp_rank=1, attn_tp_size=2, tp_size=2):
        context = standin._step_context()
    assert context.group is cpu_group and context.rows_group is device_group
    assert (context.parallel.attn_tp_rank, context.parallel.attn_tp_size, context.parallel.tp_size) == (1, 2, 2)
    assert standin._step_context() is context  # read once
    uninstall()
    assert standin._step_context().group is None


def test_one_rank_needs_no_group(engine):
    install()
    context = standin._step_context()
    assert context.group is None and context.parallel.tp_size == 1


# -- SGLang's own embed_mm_inputs, with and without the stand-in --------------------------------


_rows, steps = parity.item_rows, parity.steps


def _embed(mm_utils, step, table):
    return parity.embed(mm_utils, step, table)


@pytest.mark.parametrize("precomputed", [False, True], ids=["encoded", "precomputed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sglangs_embed_mm_inputs_gives_the_same_input_embeds_installed(engine, backend, precomputed, seed):
    sglang, _ = engine
    mm_utils = sys.modules["sglang.srt.managers.mm_utils"]
    table = torch.nn.Embedding(VOCAB, HIDDEN)
    sglang.scheduler.init_mm_embedding_cache(1 << 30)
    expected = [_embed(mm_utils, step, table) for step in steps(seed, precomputed)]
    install()
    standin.init_mm_embedding_cache(1 << 30)
    got = [_embed(mm_utils, step, table) for step in steps(seed, precomputed)]
    assert len(got) == len(expected) > 1
    for a, b in zip(expected, got):
        assert a.shape == b.shape and torch.equal(a, b)
    if not precomputed:
        theirs = sglang.scheduler.embedding_cache.mm_cache
        assert sorted(theirs) == sorted(standin.embedding_cache._entries)


@pytest.mark.parametrize("seed", [0, 1])
def test_sglangs_embed_mm_inputs_gives_the_same_input_embeds_installed_with_evs(engine, seed):
    """One request with an EVS video (SGLang handles EVS for a batch of that request
    alone): SGLang's retention mask prunes the frames, the placeholders move."""
    sglang, _ = engine
    if sglang.version == "0.5.18":
        pytest.skip("SGLang 0.5.18's EVS path takes its own VideoEVSDataItem type only")
    mm_utils = sys.modules["sglang.srt.managers.mm_utils"]
    evs_core = sglang.release.modules["sglang.srt.multimodal.evs.evs_core"]
    result_cls = sglang.release.evs.EVSEmbeddingResult
    gen = torch.Generator().manual_seed(seed)
    frames, grid, q = 3 + seed, 3, (0.4, 0.6)[seed]
    per_frame = evs_core.tokens_per_frame(q=q, num_frames=frames, frame_num_tokens=grid * grid)
    pad = PADS[Modality.VIDEO]
    ids, spans = [5, 6], []
    for n in per_frame:
        spans.append((len(ids), len(ids) + n - 1))
        ids += [pad] * n + [7, 8]
    features = torch.randn(frames * grid * grid, HIDDEN, generator=gen)
    keep = evs_core.compute_retention_mask(features, video_size_thw=(frames, grid, grid), spatial_merge_size=1, q=q)
    rows, kept = features[keep], keep.reshape(frames, -1).sum(-1).tolist()

    def encoder(items):
        return result_cls(embedding=rows.clone(), num_tokens_per_frame=list(kept))

    table = torch.nn.Embedding(VOCAB, HIDDEN)

    def run():
        out, chunk = [], 6 + seed
        for prefix in range(0, len(ids), chunk):
            extend = min(chunk, len(ids) - prefix)
            item = Item(modality=Modality.VIDEO, hash=777 + seed, offsets=list(spans), pad_value=pad,
                        feature=torch.zeros(1), model_specific_data={"pre_chunked_input_ids": list(ids)})
            embeds, _ = mm_utils.embed_mm_inputs(
                mm_inputs_list=[types.SimpleNamespace(mm_items=[item])], extend_prefix_lens=[prefix],
                extend_seq_lens=[extend], input_ids=torch.tensor(ids[prefix: prefix + extend]),
                input_embedding=table, data_embedding_func_mapping={Modality.VIDEO: encoder},
            )
            out.append(embeds)
        return out

    sglang.scheduler.init_mm_embedding_cache(1 << 30)
    expected = run()
    install()
    standin.init_mm_embedding_cache(1 << 30)
    got = run()
    assert sum(kept) == len(rows) and kept != list(per_frame), "the case must prune unevenly"
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a, b)
