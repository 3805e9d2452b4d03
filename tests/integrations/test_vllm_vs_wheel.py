"""The vLLM integration against vLLM's own gather and merge, run from the official wheel.

vLLM's ``EncoderRunner.gather_mm_embeddings`` (model runner v2),
``GPUModelRunner._gather_mm_embeddings`` (v1) and ``_merge_multimodal_embeddings`` run on
CPU from the release's source files (``benchmarks/_vllm_wheel.py`` reads them out of the
wheel on the registry once, into the wheel cache), on vLLM's own ``PlaceholderRange`` and
``MultiModalFeatureSpec``; ``mm_schedule.integrations.vllm.verify`` compares every result
of ours with theirs bit for bit. Skipped, with the reason, when neither the cache nor the
registry can provide the files.

Marker ``realworld``: needs the package registry the first time.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
import types
from collections import Counter
from pathlib import Path

import pytest
import torch

from mm_schedule.integrations.vllm import SUPPORTED_RELEASES, verify

pytestmark = pytest.mark.realworld

LOADER = Path(__file__).resolve().parents[2] / "benchmarks" / "_vllm_wheel.py"
NEWEST, PREVIOUS = SUPPORTED_RELEASES[0], SUPPORTED_RELEASES[1]


def _loader():
    spec = importlib.util.spec_from_file_location("mm_vllm_wheel_under_test", LOADER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


wheel = _loader()


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))
_codes: dict[str, verify.VllmCode] = {}


def vllm_code(version: str) -> verify.VllmCode:
    if version not in _codes:
        try:
            release = wheel.load_release(version)
        except wheel.WheelUnavailable as exc:
            pytest.skip(f"vLLM {version}'s files are not in the wheel cache and the registry cannot provide them: {exc}")
        assert not any(k == "vllm" or k.startswith("vllm.") for k in sys.modules)  # nothing left behind
        assert release.encoder_runner is not None
        # Model runner v1 (vllm/v1/worker/gpu_model_runner.py) is gone from 0.34.0 on.
        assert (release.gpu_model_runner is None) == (_key(version) >= (0, 34, 0))
        _codes[version] = verify.from_modules(version, release.modules)
    return _codes[version]


def test_newest_release_matches_on_random_steps_in_fp32_and_bf16():
    code = vllm_code(NEWEST)
    n, problems = verify.run_cases(code, 120, seed=0)
    assert problems == []
    # The cases exercise what they claim to: is_embed masks, windows cutting items, shared items.
    masks = cuts = shared = rows = 0
    for seed in range(n):
        case = verify.build_case(code, seed)
        uses = Counter(f.identifier for r in case.req_ids for f in case.features[r])
        shared += sum(1 for v in uses.values() if v > 1)
        for r, done, count in zip(case.req_ids, case.computed, case.scheduled):
            for f in case.features[r]:
                p = f.mm_position
                masks += p.is_embed is not None
                cuts += any(p.offset < edge < p.offset + p.length for edge in (done, done + count))
                rows += max(0, min(done + count, p.offset + p.length) - max(done, p.offset))
    assert masks > 100 and cuts > 50 and shared > 50 and rows > 1000


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [1, 7, 16, 61])
def test_chunked_prefill_over_a_whole_prompt_matches_every_step(dtype, chunk):
    """One prompt per request, consumed chunk by chunk: every step's window cuts items."""
    code = vllm_code(NEWEST)
    case = verify.build_case(code, 4242, dtype=dtype, n_requests=3, chunked=False)
    prompts = list(case.scheduled)
    steps = 0
    for start in range(0, max(prompts), chunk):
        active = [i for i, p in enumerate(prompts) if start < p]
        case.req_ids = [f"req-4242-{i}" for i in active]
        case.computed = [start for _ in active]
        case.scheduled = [min(chunk, prompts[i] - start) for i in active]
        case.prefill_lens = [prompts[i] for i in active]
        case.text = torch.randn(sum(case.scheduled), case.hidden).to(dtype)
        assert verify.compare(code, case) == []
        steps += 1
    assert steps >= max(prompts) // chunk


def test_previous_release_matches():
    """Every listed release is compared by ``benchmarks/bench_vs_vllm.py``; here the one
    before the newest (older ones import transformers for real, too slow for the suite)."""
    n, problems = verify.run_cases(vllm_code(PREVIOUS), 30, seed=500)
    assert n == 30 and problems == []


def test_a_wrong_row_is_caught(monkeypatch):
    """Negative control: one changed element of the fused result is reported."""
    code = vllm_code(NEWEST)
    honest = verify.ours_gather.StepRows.merge_into

    def corrupt(self, inputs_embeds):
        out = honest(self, inputs_embeds)
        if self.n_rows:
            out[self.fused[3]] += 1
        return out

    monkeypatch.setattr(verify.ours_gather.StepRows, "merge_into", corrupt)
    problems = verify.compare(code, verify.build_case(code, 3))
    assert any("merge_into()" in p for p in problems)


def test_the_triton_kernel_path_matches_under_the_interpreter(monkeypatch):
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("run with TRITON_INTERPRET=1 (as `make test` does) to run the Triton kernels on CPU tensors")
    pytest.importorskip("triton")
    from mm_schedule.kernels.backend import refresh_backend

    code = vllm_code(NEWEST)
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", "triton")
    refresh_backend()
    launches = []
    from mm_schedule.kernels.segment_copy import launch as kernel_gather

    real_launch = kernel_gather.launch_trusted

    def counting(sources, segments, dest, **kw):
        launches.append(len(segments))
        return real_launch(sources, segments, dest, **kw)

    monkeypatch.setattr(kernel_gather, "launch_trusted", counting)
    import mm_schedule.kernels.segment_copy.trusted as trusted

    trusted._triton_launcher.cache_clear()
    try:
        n, problems = verify.run_cases(code, 2, seed=901)
        assert n == 2
    finally:
        monkeypatch.undo()
        refresh_backend()
        trusted._triton_launcher.cache_clear()
    assert problems == []
    assert len(launches) >= 2 * 3  # each case: gather(), merge_into() and the drop-in merges, one launch each


def test_0_34_gather_and_merge_are_0_33s_text():
    """0.34.0's gather, placeholder structure and merge are 0.33.0's own text (model
    runner v2's gather is the one 0.34.0 kept)."""
    import dataclasses
    import inspect

    new, old = vllm_code("0.34.0"), vllm_code("0.33.0")
    pairs = [(new.encoder_runner.gather_mm_embeddings, old.encoder_runner.gather_mm_embeddings),
             (new.merge, old.merge), (new.modalities, old.modalities),
             *((getattr(new.PlaceholderRange, m), getattr(old.PlaceholderRange, m))
               for m in ("get_embeds_indices_in_range", "get_num_embeds"))]
    for a, b in pairs:
        assert inspect.getsource(a) == inspect.getsource(b), a.__qualname__
    assert new.gpu_model_runner is None and old.gpu_model_runner is not None
    fields = [(f.name, f.type) for f in dataclasses.fields(new.PlaceholderRange)]
    assert fields == [(f.name, f.type) for f in dataclasses.fields(old.PlaceholderRange)]


def _interleaved_step(code, hidden=8):
    """One request whose video interleaves its audio (audio in video) and an image after
    them, a second request with an image: vLLM's Omni models merge such steps by modality."""
    gen = torch.Generator().manual_seed(7)
    rng_mask = torch.tensor([True, False] * 6)
    feats = [code.MultiModalFeatureSpec(data=None, modality="video", identifier="v",
                                        mm_position=code.PlaceholderRange(1, 12, rng_mask)),
             code.MultiModalFeatureSpec(data=None, modality="audio", identifier="a",
                                        mm_position=code.PlaceholderRange(2, 11, torch.tensor([True, False] * 5 + [True]))),
             code.MultiModalFeatureSpec(data=None, modality="image", identifier="i",
                                        mm_position=code.PlaceholderRange(15, 4, None))]
    other = [code.MultiModalFeatureSpec(data=None, modality="image", identifier="j",
                                        mm_position=code.PlaceholderRange(0, 3, None))]
    outputs = {k: torch.randn(n, hidden, generator=gen) for k, n in (("v", 6), ("a", 6), ("i", 4), ("j", 3))}
    case = verify.Case(seed=7, dtype=torch.float32, hidden=hidden, req_ids=["omni", "img"],
                       features={"omni": feats, "img": other}, computed=[0, 0], scheduled=[20, 4],
                       prefill_lens=[20, 4], outputs=outputs, text=torch.randn(24, hidden, generator=gen))
    return case


def test_models_that_merge_by_modality_get_vllms_tags_from_the_drop_in_gather():
    """vLLM's own ``get_mm_embedding_modalities`` (what Qwen2.5-Omni's and Qwen3-Omni's
    interleaved merge calls) on our drop-in gather: every row is tagged, and the rows of
    each modality, concatenated, are those of vLLM's own gather."""
    code = vllm_code(NEWEST)
    case = _interleaved_step(code)
    theirs, theirs_mask = verify.vllm_gather_v2(code, case)
    ours_rows, ours_mask = verify.ours_gather.gather_mm_embeddings(
        types.SimpleNamespace(mm_features=case.features, encoder_outputs=case.outputs), case.req_ids, case.n_tokens,
        case.scheduled, verify._query_starts(case), case.prefill_lens, case.computed)
    assert torch.equal(ours_mask, theirs_mask)
    their_kinds, our_kinds = code.modalities(theirs), code.modalities(ours_rows)
    assert their_kinds == ["video", "audio", "image", "image"] and our_kinds == ["video", "audio", "image"]
    for kind in ("video", "audio", "image"):
        a = torch.cat([t for t, k in zip(theirs, their_kinds) if k == kind])
        b = torch.cat([t for t, k in zip(ours_rows, our_kinds) if k == kind])
        assert torch.equal(a, b), kind
    # The control: rows packed without the tags are what vLLM's function refuses.
    with pytest.raises(ValueError, match="Missing modality"):
        code.modalities([torch.cat(theirs)])


def _probe_with(monkeypatch, code):
    from mm_schedule.integrations.vllm import releases

    monkeypatch.setattr(releases, "installed_version", lambda: "0.99.0")
    monkeypatch.setattr(verify, "from_installed", lambda: (code, []))
    releases.forget_installed_check()
    return releases


def test_an_unlisted_release_that_agrees_is_accepted_with_one_warning(monkeypatch, caplog):
    from mm_schedule.integrations import vllm as mmv

    releases = _probe_with(monkeypatch, vllm_code(NEWEST))
    try:
        start = time.perf_counter()
        with caplog.at_level(logging.WARNING, logger="mm_schedule.integrations.vllm"):
            assert mmv.plan_rows([], [], [], [], {}).n_rows == 0
            probe_s = time.perf_counter() - start
            mmv._merge_multimodal_embeddings(torch.zeros(1, 1), [torch.ones(1, 1)], torch.ones(1, dtype=torch.bool))
            mmv.plan_rows([], [], [], [], {})
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "vLLM 0.99.0" in warnings[0].getMessage()
        assert "agreed" in warnings[0].getMessage() and "0.99.0" in releases._accepted
        assert probe_s < 2.0
    finally:
        releases._accepted.discard("0.99.0")
        releases.forget_installed_check()


@pytest.mark.parametrize("which", ["merge", "gather"])
def test_an_unlisted_release_that_differs_in_one_function_is_refused_naming_it(monkeypatch, which):
    import dataclasses

    from mm_schedule.integrations import vllm as mmv

    code = vllm_code(NEWEST)
    if which == "merge":
        honest_merge = code.merge

        def merge(inputs_embeds, multimodal_embeddings, is_multimodal):  # one row's sign flipped
            out = honest_merge(inputs_embeds, multimodal_embeddings, is_multimodal)
            rows = is_multimodal.nonzero().flatten()
            if rows.numel():
                out[rows[-1]] *= -1
            return out

        changed = dataclasses.replace(code, merge=merge)
    else:
        class Runner(code.encoder_runner):
            def gather_mm_embeddings(self, *args, **kwargs):  # the last item of the step dropped
                rows, mask = super().gather_mm_embeddings(*args, **kwargs)
                if rows:
                    mask[mask.nonzero().flatten()[-rows[-1].shape[0]:]] = False
                    rows = rows[:-1]
                return rows, mask

        changed = dataclasses.replace(code, encoder_runner=Runner)
    releases = _probe_with(monkeypatch, changed)
    try:
        with pytest.raises(mmv.UnsupportedVLLMRelease, match=r"vLLM 0\.99\.0 .*differ.*: seed \d+") as first:
            mmv.plan_rows([], [], [], [], {})
        with pytest.raises(mmv.UnsupportedVLLMRelease) as again:  # decided once, raised by every entry point
            mmv._merge_multimodal_embeddings(torch.zeros(1, 1), [torch.ones(1, 1)], torch.ones(1, dtype=torch.bool))
        assert str(again.value) == str(first.value) and "0.99.0" not in releases._accepted
        named = "merge_into()" if which == "merge" else "rows differ"
        assert named in str(first.value)
        mmv.accept_release("0.99.0")  # the explicit override still works
        assert mmv.plan_rows([], [], [], [], {}).n_rows == 0
    finally:
        releases._accepted.discard("0.99.0")
        releases.forget_installed_check()


def test_untagged_rows_are_caught(monkeypatch):
    """Negative control: the drop-in gather without vLLM's modality tags is reported."""
    code = vllm_code(NEWEST)
    monkeypatch.setattr(verify.ours_gather.StepRows, "gather_by_modality",
                        lambda self: [] if self.gather() is None else [self.gather()])
    problems = [p for seed in range(6) for p in verify.compare(code, verify.build_case(code, seed))]
    assert any("get_mm_embedding_modalities" in p for p in problems)


def test_threads_starting_together_share_one_probe(monkeypatch, caplog):
    import threading

    from mm_schedule.integrations import vllm as mmv

    releases = _probe_with(monkeypatch, vllm_code(NEWEST))
    runs = []
    honest = releases.verify_release

    def counted(*args, **kwargs):
        runs.append(threading.get_ident())
        return honest(*args, **kwargs)

    monkeypatch.setattr(releases, "verify_release", counted)
    results, barrier = [], threading.Barrier(4)

    def first_step():
        barrier.wait()
        results.append(mmv.plan_rows([], [], [], [], {}).n_rows)

    try:
        with caplog.at_level(logging.WARNING, logger="mm_schedule.integrations.vllm"):
            threads = [threading.Thread(target=first_step) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert results == [0, 0, 0, 0] and len(runs) == 1
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    finally:
        releases._accepted.discard("0.99.0")
        releases.forget_installed_check()


def _doc_recipe() -> str:
    """The drop-in plugin of docs/vllm.md (the block that replaces both runners' gathers)."""
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "vllm.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)
    (recipe,) = [b for b in blocks if "EncoderRunner.gather_mm_embeddings =" in b and "GPUModelRunner" in b]
    return recipe


@pytest.mark.parametrize("version", [NEWEST, PREVIOUS])
def test_the_documented_drop_in_recipe_runs_on_each_runner_layout(monkeypatch, version):
    """docs/vllm.md's plugin, executed against a fresh load of the release's own modules
    (0.34.0: model runner v2 only; 0.33.0: both), replaces what that release has, and vLLM's
    call sites then give vLLM's own results."""
    release = wheel.load_release(version)
    code = verify.from_modules(version, release.modules)
    cases = [verify.build_case(code, seed) for seed in range(6)]
    expected = [code.merge(c.text.clone(), *verify.vllm_gather_v2(code, c)) for c in cases]
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    for name, module in release.modules.items():
        parts = name.split(".")
        for k in range(1, len(parts)):  # their parent packages, empty
            parent = ".".join(parts[:k])
            monkeypatch.setitem(sys.modules, parent, sys.modules.get(parent) or types.ModuleType(parent))
        monkeypatch.setitem(sys.modules, name, module)
    exec(compile(_doc_recipe(), "docs/vllm.md", "exec"), {"__name__": "vllm_plugin"})
    from mm_schedule.integrations import vllm as mmv

    utils = release.models_utils
    assert utils._merge_multimodal_embeddings is mmv._merge_multimodal_embeddings
    runners = [c for c in (code.encoder_runner, code.gpu_model_runner) if c is not None]
    assert len(runners) == (1 if version == NEWEST else 2)
    for cls, name in zip(runners, ("gather_mm_embeddings", "_gather_mm_embeddings")):
        assert vars(cls)[name].__code__.co_filename == "docs/vllm.md", (cls, name)
    for case, want in zip(cases, expected):
        got = utils._merge_multimodal_embeddings(case.text.clone(), *verify.vllm_gather_v2(code, case))
        assert verify._same(got, want)
        if code.gpu_model_runner is not None:
            got = utils._merge_multimodal_embeddings(case.text.clone(), *verify.vllm_gather_v1(code, case))
            assert verify._same(got, want)


def test_the_probe_runs_inside_inference_mode():
    """vLLM's workers run steps under ``torch.inference_mode``; the probe works there."""
    from mm_schedule.integrations.vllm import releases

    try:
        with torch.inference_mode():
            assert releases.verify_release(vllm_code(NEWEST), installed="0.99.1") == "0.99.1"
        assert "0.99.1" in releases._accepted
    finally:
        releases._accepted.discard("0.99.1")
