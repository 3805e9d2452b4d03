"""The placeholder mask in one launch: the Triton kernel (interpreted, on CPU tensors) against
``torch.isin`` on fresh random inputs with a poisoned output; the operator's shape function
(meta and fake tensors); which path a step takes; and the kernel compiled for NVIDIA and AMD."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mm_schedule.errors import KernelInputError
from mm_schedule.kernels import placeholder_mask as pm
from mm_schedule.kernels.backend import refresh_backend

TOKEN_DTYPES = (torch.int64, torch.int32)
ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _isin(tokens, ids):
    return torch.isin(tokens.to(torch.int64), ids.to(torch.int64)).unsqueeze(-1)


def _case(gen, n_tokens, n_ids, token_dtype, id_dtype):
    """Ids drawn in the range the id dtype holds, tokens mostly from the same range, some ids
    repeated (one pad value per item: a shared image repeats it)."""
    high = {torch.uint8: 256, torch.int8: 128, torch.int16: 1 << 15}.get(id_dtype, 1 << 20)
    low = 0 if id_dtype is torch.uint8 else -high
    ids = torch.randint(low, high, (n_ids,), generator=gen, dtype=torch.int64)
    if n_ids > 2:
        ids[1] = ids[0]
    tokens = torch.randint(low, high, (n_tokens,), generator=gen, dtype=torch.int64)
    if n_ids and n_tokens:
        picks = torch.randint(0, n_ids, (n_tokens // 3,), generator=gen)
        tokens[torch.randperm(n_tokens, generator=gen)[: n_tokens // 3]] = ids[picks]
    return tokens.to(token_dtype), ids.to(id_dtype)


@pytest.mark.parametrize("token_dtype", TOKEN_DTYPES)
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize(("n_tokens", "n_ids"), [(1, 1), (255, 15), (256, 16), (257, 17), (1000, 64), (3, 40),
                                                 (600, 1), (40, 0), (0, 5)])
def test_the_kernel_marks_what_isin_marks(triton_backend, token_dtype, id_dtype, n_tokens, n_ids):
    gen = torch.Generator().manual_seed(n_tokens * 131 + n_ids)
    tokens, ids = _case(gen, n_tokens, n_ids, token_dtype, id_dtype)
    for poison in (True, False):
        out = torch.full((n_tokens, 1), poison, dtype=torch.bool)
        pm.launch_placeholder_mask(tokens, ids, out)
        assert torch.equal(out, _isin(tokens, ids)), poison


def test_wide_ids_never_collide_with_narrow_tokens(triton_backend):
    """An int64 pad value whose low 32 bits equal an int32 token id is not that token."""
    tokens = torch.tensor([5, 7, -1, 0], dtype=torch.int32)
    ids = torch.tensor([(1 << 32) + 5, (1 << 33) - 1, 7], dtype=torch.int64)
    out = torch.ones((4, 1), dtype=torch.bool)
    pm.launch_placeholder_mask(tokens, ids, out)
    assert out.view(-1).tolist() == [False, True, False, False]
    assert torch.equal(pm.placeholder_mask_ref(tokens, ids), out)


def test_the_reference_is_isin_in_the_wider_dtype():
    gen = torch.Generator().manual_seed(5)
    for token_dtype in TOKEN_DTYPES:
        for id_dtype in ID_DTYPES:
            tokens, ids = _case(gen, 500, 37, token_dtype, id_dtype)
            assert torch.equal(pm.placeholder_mask_ref(tokens, ids), _isin(tokens, ids))
    assert not pm.placeholder_mask_ref(torch.arange(4), torch.empty(0, dtype=torch.int64)).any()


class _Operators(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_on_meta_the_mask_is_one_operator_with_a_shape():
    tokens = torch.empty(70_000, dtype=torch.int64, device="meta")
    ids = torch.empty(1024, dtype=torch.int64, device="meta")
    assert pm.marks_in_one_launch(tokens, ids)
    with _Operators() as seen:
        mask = pm.placeholder_mask(tokens, ids)
    assert seen.names == ["mm_schedule.placeholder_mask"]
    assert mask.shape == (70_000, 1) and mask.dtype is torch.bool and mask.is_meta


def test_fake_tensors_get_the_shape_too():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        mask = pm.MASK_OP(torch.empty(9, dtype=torch.int32), torch.empty(3, dtype=torch.int64))
    assert mask.shape == (9, 1) and mask.dtype is torch.bool


@pytest.mark.parametrize(("tokens", "ids", "message"), [
    (torch.empty(2, 3, dtype=torch.int64), torch.empty(3, dtype=torch.int64), "1-D input_ids"),
    (torch.empty(3, dtype=torch.int16), torch.empty(3, dtype=torch.int64), "int32/int64 input_ids"),
    (torch.empty(3, dtype=torch.int64), torch.empty(3, dtype=torch.float32), "got torch.int64 and torch.float32"),
])
def test_the_operator_refuses_what_it_cannot_mark(tokens, ids, message):
    for device in ("meta", "cpu"):
        with pytest.raises(KernelInputError, match=message):
            pm.MASK_OP(tokens.to(device), ids.to(device))


def test_the_operator_on_the_cpu_is_the_reference():
    gen = torch.Generator().manual_seed(9)
    tokens, ids = _case(gen, 300, 20, torch.int64, torch.int32)
    assert torch.equal(pm.MASK_OP(tokens, ids), _isin(tokens, ids))


def test_float_ids_are_refused_by_name():
    with pytest.raises(KernelInputError, match=r"placeholder_ids must be an integer tensor, got torch\.float32"):
        pm.placeholder_mask(torch.arange(4), torch.tensor([1.0]))


def test_beyond_its_size_or_forced_to_torch_the_step_takes_the_sorted_search(monkeypatch):
    tokens = torch.empty(1 << 16, dtype=torch.int64, device="meta")
    few, many = (torch.empty(n, dtype=torch.int64, device="meta") for n in (64, (pm.KERNEL_MAX_COMPARES >> 16) + 1))
    assert pm.marks_in_one_launch(tokens, few) and not pm.marks_in_one_launch(tokens, many)
    with _Operators() as seen:
        assert pm.placeholder_mask(tokens, many).shape == (1 << 16, 1)
    assert "mm_schedule.placeholder_mask" not in seen.names and "aten.bucketize" in seen.names
    # CPU tensors: the scheduler's own pass (a C helper), never the operator.
    assert not pm.marks_in_one_launch(torch.arange(10), torch.arange(3))
    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", "torch")
    refresh_backend()
    assert not pm.marks_in_one_launch(tokens, few)


def test_the_kernel_compiles_for_nvidia_and_amd_without_spilling(aot_cache_dir):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = aot_cache_dir
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    script = (
        "import json\n"
        "from mm_schedule.kernels.tools.aot import TARGETS, compile_spec, placeholder_mask_specs\n"
        "print(json.dumps([dict(compile_spec(spec, target), variant=spec.variant, target=target)\n"
        "                  for spec in placeholder_mask_specs() for target in TARGETS]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = json.loads(proc.stdout)
    assert {(r["variant"], r["target"]) for r in reports} == {
        (f"{t}-{i}-{a}", target) for t in ("i64", "i32") for i in ("i64", "i32") for a in ("aligned", "unaligned")
        for target in ("sm80", "sm90", "gfx90a", "gfx942", "gfx950")}
    assert all(r["spill_bytes"] == 0 for r in reports), [r for r in reports if r["spill_bytes"]]
