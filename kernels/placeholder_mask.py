"""Which tokens of ``input_ids`` are placeholders, in one launch that never waits for the device.

``placeholder_mask(input_ids, placeholder_ids)`` is the ``[N, 1]`` bool mask SGLang's
``get_embedding_and_mask`` returns: token ``t`` is marked when its id is one of the
placeholder ids (SGLang passes one per item, so hundreds in a large step).

``torch.isin`` gives that mask, but for more than a handful of ids it sorts through
``unique``, whose output size the host must read: a device sync in the middle of the
step. The alternatives never sync:

* ``placeholder_mask_kernel``: each program loads a block of tokens and compares it with
  every placeholder id, streamed through in blocks. One launch, no sort, no scratch
  memory; the work is tokens x ids comparisons, so it is used up to ``KERNEL_MAX_COMPARES``
  (about a tenth of a millisecond on a current GPU);
* ``sorted_membership`` (the reference, and the path beyond that size or without
  Triton): the ids sorted, two searches and a subtraction, five launches.

Ids are compared as int64 whatever their dtypes, so a wide pad value is never narrowed
into a collision with a token id.

The kernel is registered as ``torch.ops.mm_schedule.placeholder_mask`` with a shape
function for ``meta`` tensors: a dry run of a step (meta tensors, torch.compile's fake
tensors) dispatches the one operator a GPU launches. ``marks_in_one_launch`` says when a
caller gets it; the scheduler's mask (``mm_schedule.placeholders``) takes it on GPUs and
on ``meta``, and keeps its own C pass for CPU tensors.

Equivalent PyTorch::

    torch.isin(input_ids.reshape(-1), placeholder_ids).unsqueeze(-1)
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import KernelInputError
from ._triton import HAS_TRITON, tl, triton
from .backend import current_choice, launches_kernels_on
from .segment_copy.fast_launch import LaunchSpec
from .streams import layer

OP_NAME = "mm_schedule::placeholder_mask"
# Tokens x ids the kernel compares at most (2**31: about 0.1 ms of a current GPU's integer
# throughput); a larger step takes the sorted search, whose work grows as tokens x log(ids).
KERNEL_MAX_COMPARES = 1 << 31
BLOCK_TOKENS = 256
BLOCK_IDS = 16
NUM_WARPS = 4
TOKEN_DTYPES = (torch.int32, torch.int64)
# Placeholder id dtypes the kernel widens to int64 exactly.
ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_INT32_MAX = 0x7FFFFFFF

if HAS_TRITON:

    @triton.jit(do_not_specialize=["n_tokens", "n_ids"])
    def placeholder_mask_kernel(tokens_ptr, ids_ptr, out_ptr, n_tokens, n_ids,
                                BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        live = rows < n_tokens
        tokens = tl.load(tokens_ptr + rows, mask=live, other=0).to(tl.int64)
        # Matches accumulate per (token, lane of the id block); one reduction at the end.
        seen = tl.zeros([BLOCK_T, BLOCK_I], dtype=tl.int1)
        for start in range(0, n_ids, BLOCK_I):
            cols = start + tl.arange(0, BLOCK_I)
            real = cols < n_ids
            ids = tl.load(ids_ptr + cols, mask=real, other=0).to(tl.int64)
            seen = seen | ((tokens[:, None] == ids[None, :]) & real[None, :])
        marked = tl.max(seen.to(tl.int32), axis=1)
        tl.store(out_ptr + rows, marked.to(tl.uint8), mask=live)

    _SPEC = LaunchSpec(placeholder_mask_kernel, {"BLOCK_T": BLOCK_TOKENS, "BLOCK_I": BLOCK_IDS},
                       {"num_warps": NUM_WARPS, "num_stages": 1})
else:
    placeholder_mask_kernel = _SPEC = None


def sorted_membership(tokens: Any, ids: Any) -> Any:
    """``[N]`` bool: which ``tokens`` are among ``ids`` (both 1-D, one integer dtype, one
    device), without a host sync. A token is one when its left and right insertion points
    in the sorted ids differ: a sort, two ``bucketize`` (the device kernel of
    ``searchsorted`` with its arguments swapped) and an in-place subtraction read as bool.
    Those have native shape functions where an out-of-place compare's runs as Python
    (meta and fake tensors)."""
    ids = ids.sort().values
    right = torch.bucketize(tokens, ids, right=True, out_int32=True)
    return right.sub_(torch.bucketize(tokens, ids, out_int32=True)).bool()


def placeholder_mask_ref(input_ids: Any, placeholder_ids: Any) -> Any:
    """Plain-torch reference of ``placeholder_mask`` (and its path without the kernel):
    ``[N, 1]`` bool, computed in the wider of the two dtypes."""
    tokens, ids = _flat(input_ids), _flat(placeholder_ids).to(input_ids.device, non_blocking=True)
    common = torch.promote_types(tokens.dtype, ids.dtype)
    tokens, ids = tokens.to(common), ids.to(common)
    if not ids.numel():
        return torch.zeros((tokens.numel(), 1), dtype=torch.bool, device=tokens.device)
    return sorted_membership(tokens, ids).unsqueeze(-1)


def _flat(t: Any) -> Any:
    return t if t.dim() == 1 else t.reshape(-1)


def marks_in_one_launch(tokens: Any, ids: Any, device_type: str | None = None) -> bool:
    """Whether ``placeholder_mask`` of these 1-D tensors (on one device, of type
    ``device_type`` when the caller knows it) is the kernel's one launch: on a GPU the kernel
    would run (Triton installed, the backend not forced to torch) and the step is within
    ``KERNEL_MAX_COMPARES``; on ``meta``, whether a GPU would take it. Shapes and dtypes
    only: nothing is read."""
    device = device_type or tokens.device.type
    if device == "cpu" or not launches_kernels_on(device):
        return False
    return (tokens.dtype in TOKEN_DTYPES and ids.dtype in ID_DTYPES
            and tokens.numel() * ids.numel() <= KERNEL_MAX_COMPARES)


def _kernel_runs_on_gpus() -> bool:
    requested, interpreted, has_triton = current_choice()
    return has_triton and requested != "torch" and not interpreted


def placeholder_mask(input_ids: Any, placeholder_ids: Any) -> Any:
    """``[N, 1]`` bool mask of the placeholder tokens of ``input_ids`` (any shape, N tokens);
    ``placeholder_ids`` a tensor of integer ids, moved to ``input_ids``' device if elsewhere."""
    _check_integer(input_ids, "input_ids")
    _check_integer(placeholder_ids, "placeholder_ids")
    tokens = _flat(input_ids)
    ids = _flat(placeholder_ids)
    if ids.device != tokens.device:
        ids = ids.to(tokens.device, non_blocking=True)
    if marks_in_one_launch(tokens, ids):
        return MASK_OP(tokens, ids)
    return placeholder_mask_ref(tokens, ids)


def launch_placeholder_mask(tokens: Any, ids: Any, out: Any) -> Any:
    """Run the kernel: ``out`` (``[N, 1]`` bool, contiguous) marks which of the 1-D
    contiguous ``tokens`` are among the 1-D contiguous ``ids``. No checks beyond the
    layout (the op and the tests call this); CPU tensors need ``TRITON_INTERPRET=1``."""
    n_tokens, n_ids = tokens.numel(), ids.numel()
    if not n_tokens:
        return out
    if not n_ids:
        return out.zero_()
    marks = out.view(torch.uint8).view(-1)
    grid = -(-n_tokens // BLOCK_TOKENS)
    device = tokens.device
    streams = layer(device)
    with streams.guard(device):
        # Triton types an integer by its value (i32 below 2**31) and checks pointers for
        # 16-byte alignment: what a compiled launch is specialised on, besides the spec.
        variant = (tokens.data_ptr() % 16 == 0, ids.data_ptr() % 16 == 0, marks.data_ptr() % 16 == 0,
                   n_tokens > _INT32_MAX, n_ids > _INT32_MAX)
        _SPEC.launch(grid, (tokens, ids, marks, n_tokens, n_ids), variant, streams.current_raw(device))
    return out


def _check_integer(t: Any, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise KernelInputError(f"{what} must be a tensor, got {type(t).__name__}")
    dtype = t.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype is torch.bool:
        raise KernelInputError(f"{what} must be an integer tensor, got {dtype}")


def _checked_layout(tokens: Any, ids: Any) -> None:
    """What the op requires of its arguments (shape functions included)."""
    if tokens.dim() != 1 or ids.dim() != 1:
        raise KernelInputError(
            f"{OP_NAME} takes 1-D input_ids and placeholder_ids, got shapes {tuple(tokens.shape)} and"
            f" {tuple(ids.shape)}"
        )
    if tokens.dtype not in TOKEN_DTYPES or ids.dtype not in ID_DTYPES:
        raise KernelInputError(
            f"{OP_NAME} takes int32/int64 input_ids and integer placeholder_ids of at most 64 bits,"
            f" got {tokens.dtype} and {ids.dtype}"
        )
    if tokens.device != ids.device:
        raise KernelInputError(f"{OP_NAME}: input_ids are on {tokens.device}, placeholder_ids on {ids.device}")


def _op_on_gpu(tokens: Any, ids: Any) -> Any:
    _checked_layout(tokens, ids)
    if not _kernel_runs_on_gpus():
        return placeholder_mask_ref(tokens, ids)
    out = torch.empty((tokens.numel(), 1), dtype=torch.bool, device=tokens.device)
    return launch_placeholder_mask(tokens.contiguous(), ids.contiguous(), out)


def _op_shape(tokens: Any, ids: Any) -> Any:
    _checked_layout(tokens, ids)
    return torch.empty((tokens.numel(), 1), dtype=torch.bool, device=tokens.device)


def _op_elsewhere(tokens: Any, ids: Any) -> Any:
    _checked_layout(tokens, ids)
    return placeholder_mask_ref(tokens, ids)


def _register() -> Any:
    # A plain library definition: its meta kernel is one dispatch (a few microseconds),
    # where torch.library.custom_op's fake-implementation wrapper costs several times that.
    library = torch.library.Library("mm_schedule", "FRAGMENT")
    library.define("placeholder_mask(Tensor input_ids, Tensor placeholder_ids) -> Tensor")
    library.impl("placeholder_mask", _op_shape, "Meta")
    library.impl("placeholder_mask", _op_on_gpu, "CUDA")
    library.impl("placeholder_mask", _op_elsewhere, "CompositeExplicitAutograd")
    return library


_LIBRARY = _register()
MASK_OP = torch.ops.mm_schedule.placeholder_mask.default
