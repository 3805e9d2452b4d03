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
import os
import sys
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
_codes: dict[str, verify.VllmCode] = {}


def vllm_code(version: str) -> verify.VllmCode:
    if version not in _codes:
        try:
            release = wheel.load_release(version)
        except wheel.WheelUnavailable as exc:
            pytest.skip(f"vLLM {version}'s files are not in the wheel cache and the registry cannot provide them: {exc}")
        assert not any(k == "vllm" or k.startswith("vllm.") for k in sys.modules)  # nothing left behind
        assert release.encoder_runner is not None and release.gpu_model_runner is not None
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
