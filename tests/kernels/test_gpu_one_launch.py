"""On a real GPU: the placeholder mask's kernel and the copy of whole sources by address, both
against torch on fresh random inputs with poisoned outputs, and neither waiting for the device.

Run by the GPU check (``pytest -m gpu`` with the kernels compiled, not interpreted); skipped
elsewhere. The CPU proofs (the same kernels under the interpreter) are in
``test_placeholder_mask.py`` and ``tests/schedule/test_copy_by_address.py``."""


import pytest
import torch

from mm_schedule.kernels import placeholder_mask as pm
from mm_schedule.kernels.segment_copy.launch import launch_whole_sources

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("n_tokens", "n_ids"), [(1, 1), (5000, 64), (75_000, 1024), (300_000, 4096), (77, 0)])
@pytest.mark.parametrize("token_dtype", [torch.int64, torch.int32])
def test_the_mask_kernel_marks_what_isin_marks_without_waiting(gpu, n_tokens, n_ids, token_dtype):
    gen = torch.Generator().manual_seed(n_tokens + n_ids)
    ids = torch.randint(-(1 << 40), 1 << 40, (n_ids,), generator=gen)
    tokens = torch.randint(0, 150_000, (n_tokens,), generator=gen)
    if n_ids:
        picks = torch.randint(0, n_ids, (n_tokens // 3,), generator=gen)
        tokens[torch.randperm(n_tokens, generator=gen)[: n_tokens // 3]] = ids[picks] % (1 << 31)
        ids[: n_ids // 2] %= 1 << 31
    tokens, ids = tokens.to(token_dtype).to(gpu), ids.to(gpu)
    want = torch.isin(tokens.to(torch.int64), ids).unsqueeze(-1)
    out = torch.ones((n_tokens, 1), dtype=torch.bool, device=gpu)  # poisoned
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pm.launch_placeholder_mask(tokens, ids, out)
        got = pm.placeholder_mask(tokens, ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(out, want) and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n_sources", [1, 129, 1024])
def test_whole_sources_by_address_equal_cat_without_waiting(gpu, dtype, n_sources):
    gen = torch.Generator().manual_seed(n_sources)
    rows = torch.randint(1, 300, (n_sources,), generator=gen).tolist()
    sources = [torch.randn(n, 1176, generator=gen).to(dtype).to(gpu) for n in rows]
    want = torch.cat(sources)
    out = torch.full_like(want, float("nan"))
    addresses = [t.data_ptr() for t in sources]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        launch_whole_sources(addresses, rows, out, dtype)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    bits = {2: torch.int16, 4: torch.int32}[out.element_size()]
    assert torch.equal(out.view(bits), want.view(bits))
