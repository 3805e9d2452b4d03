"""Merging by placeholder ids, for callers that only have ``input_ids`` (HF / SGLang style).

Two entry points share one kernel:

- ``merge_by_placeholder_ids``: write the multimodal rows into an existing
  ``input_embeds`` at the placeholder tokens (in place);
- ``embed_with_placeholders``: the text-embedding lookup fused in, so ``input_ids`` and
  the embedding weight become ``input_embeds`` with the multimodal rows already in place,
  in one pass over the output.

Neither syncs with the host. Which embedding row a placeholder takes is its rank among
the placeholders (``cumsum`` of the mask, on the device) instead of ``nonzero`` or a
boolean index, which would both wait for the device to learn a count. The only
allocations besides the output are the ``[tokens]`` mask and ranks, never
``tokens x hidden``. The kernel never reads out of bounds: a placeholder without an
embedding row, or a text id outside the vocabulary, is skipped (merge) or written as
zeros (lookup) instead. Ask for ``check=True`` to turn those into errors:

- CPU tensors: checked on the host, raising ``EmbeddingLengthMismatch`` /
  ``KernelInputError`` before anything is written;
- GPU tensors: queued as ``torch._assert_async`` on the device. It does not sync: the
  failure surfaces as a device-side assert ("CUDA error: device-side assert triggered")
  at the next synchronising call, and like every device assert it leaves the CUDA context
  unusable, so treat ``check=True`` on GPU as a debugging aid.

Placeholder ids need not be valid vocabulary ids: the lookup never reads the weight for
placeholder tokens, and the caller's ``input_ids`` are never modified.

For CUDA graphs: both calls launch a fixed grid for a fixed ``input_ids`` shape and
allocate only the two ``[tokens]`` helper tensors (inside the graph's pool when
captured); keep ``input_ids``, ``embeddings``, ``weight`` and the output at fixed
addresses and shapes between replays. ``embeddings`` may have more rows than there are
placeholders (a fixed-capacity buffer); extra rows are not read (unless ``check=True``,
which requires equality).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import EmbeddingLengthMismatch, GraphCaptureError, KernelInputError
from ._triton import HAS_TRITON, cast_to, tl, triton
from .backend import select_backend
from .dtypes import SUPPORTED_DTYPES, vector_width
from .launch_config import unaligned_config
from .streams import layer
from .tuned_configs import resolve_config

KERNEL_NAME = "placeholder_merge"

if HAS_TRITON:

    @triton.jit
    def _merge_step(mm_rows, text_rows, out_rows, h, hidden, mm_ok, text_ok, write_ok, is_mm,
                    LOOKUP_TEXT: tl.constexpr, MASK_LOADS: tl.constexpr, MASK_STORE: tl.constexpr,
                    MASK_COLS: tl.constexpr, BLOCK_H: tl.constexpr):
        cols = (h + tl.arange(0, BLOCK_H))[None, :]
        out_dtype = out_rows.dtype.element_ty
        if MASK_COLS:
            col_ok = cols < hidden
        else:
            col_ok = cols >= 0  # all true: folded away
        if MASK_LOADS or MASK_COLS:
            value = cast_to(tl.load(mm_rows + cols, mask=mm_ok & col_ok, other=0), out_dtype)
        else:
            value = cast_to(tl.load(mm_rows + cols), out_dtype)
        if LOOKUP_TEXT:
            text = tl.load(text_rows + cols, mask=text_ok & col_ok, other=0)
            value = tl.where(is_mm, value, cast_to(text, out_dtype))
        if MASK_STORE or MASK_COLS:
            tl.store(out_rows + cols, value, mask=write_ok & col_ok)
        else:
            tl.store(out_rows + cols, value)

    @triton.jit
    def _merge_rows(mm_rows, text_rows, out_rows, hidden, mm_ok, text_ok, write_ok, is_mm,
                    EVEN_H: tl.constexpr, LOOKUP_TEXT: tl.constexpr, MASK_LOADS: tl.constexpr,
                    MASK_STORE: tl.constexpr, BLOCK_H: tl.constexpr):
        """Every ``BLOCK_H`` step of the tile's rows; unmasked steps but for the last of an
        odd row length, which runs once, outside the loop."""
        # Stated, not derived: Triton 3.6 loses the divisibility of `x - x % BLOCK`, and
        # the tail step's accesses would shrink to one element each.
        full = tl.multiple_of(hidden - hidden % BLOCK_H, BLOCK_H)
        for h in range(0, full, BLOCK_H):
            _merge_step(mm_rows, text_rows, out_rows, h, hidden, mm_ok, text_ok, write_ok, is_mm,
                        LOOKUP_TEXT, MASK_LOADS, MASK_STORE, False, BLOCK_H)
        if not EVEN_H:
            if full < hidden:
                _merge_step(mm_rows, text_rows, out_rows, full, hidden, mm_ok, text_ok, write_ok,
                            is_mm, LOOKUP_TEXT, MASK_LOADS, MASK_STORE, True, BLOCK_H)

    @triton.jit(do_not_specialize=["n_tokens", "vocab", "n_mm", "hidden_vecs"])
    def placeholder_merge_kernel(
        ids_ptr,  # [T] token ids; read only when LOOKUP_TEXT
        is_mm_ptr,  # [T] uint8, 1 at placeholder tokens
        mm_count_ptr,  # [T] int64, inclusive running count of placeholders
        weight_ptr,  # [vocab, H] text embedding table; read only when LOOKUP_TEXT
        mm_ptr,  # [n_mm, H] multimodal rows in placeholder order
        out_ptr,  # [T, H]
        n_tokens,
        vocab,
        n_mm,
        hidden_vecs,  # row length in units of VEC elements (VEC is 1 when unaligned)
        LOOKUP_TEXT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_H: tl.constexpr,
        VEC: tl.constexpr,
        EVEN_H: tl.constexpr,
    ):
        tok = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        tok_ok = tok < n_tokens
        is_mm = tl.load(is_mm_ptr + tok, mask=tok_ok, other=0) != 0
        mm_row = tl.load(mm_count_ptr + tok, mask=tok_ok, other=0) - 1
        mm_ok = tok_ok & is_mm & (mm_row < n_mm)
        # A product with a constexpr: divisibility by VEC is known for every row length.
        hidden = hidden_vecs * VEC
        mm_rows = mm_ptr + tl.where(mm_ok, mm_row, 0)[:, None] * hidden
        out_rows = out_ptr + tok[:, None] * hidden
        # On AMD a masked access waits for every load in flight before the store: a tile
        # whose rows all come from one table (all placeholders with a row, or, with the
        # lookup, all text ids in range) copies unmasked; only mixed tiles and the last
        # tile mask.
        n_mm_rows = tl.sum(mm_ok.to(tl.int32), 0)
        if n_mm_rows == BLOCK_M:
            _merge_rows(mm_rows, mm_rows, out_rows, hidden, mm_ok[:, None], mm_ok[:, None],
                        mm_ok[:, None], is_mm[:, None], EVEN_H, False, False, False, BLOCK_H)
        elif LOOKUP_TEXT:
            ids = tl.load(ids_ptr + tok, mask=tok_ok, other=0).to(tl.int64)
            text_ok = tok_ok & (~is_mm) & (ids >= 0) & (ids < vocab)
            text_rows = weight_ptr + tl.where(text_ok, ids, 0)[:, None] * hidden
            if tl.sum(text_ok.to(tl.int32), 0) == BLOCK_M:
                _merge_rows(text_rows, text_rows, out_rows, hidden, text_ok[:, None],
                            text_ok[:, None], text_ok[:, None], is_mm[:, None], EVEN_H, False,
                            False, False, BLOCK_H)
            else:
                # Rows of neither kind are written as zeros.
                _merge_rows(mm_rows, text_rows, out_rows, hidden, mm_ok[:, None], text_ok[:, None],
                            tok_ok[:, None], is_mm[:, None], EVEN_H, True, True, True, BLOCK_H)
        elif n_mm_rows > 0:
            _merge_rows(mm_rows, mm_rows, out_rows, hidden, mm_ok[:, None], mm_ok[:, None],
                        mm_ok[:, None], is_mm[:, None], EVEN_H, False, True, True, BLOCK_H)


def placeholder_mask(input_ids, placeholder_ids):
    """Bool mask of the placeholder tokens of 1-D ``input_ids``, without a host sync.

    Python ids: one comparison per id (models use one to three), no host-to-device copy.
    A tensor of ids (SGLang passes one pad value per item, so hundreds): the package's
    placeholder mask (``placeholder_mask.py``: one kernel launch on a GPU, compared in the
    wider dtype), not ``torch.isin``, which sorts through ``unique`` for large id sets, and
    ``unique`` has to wait for the device to learn its output size.
    """
    if not isinstance(placeholder_ids, (int, list, tuple)):
        from .placeholder_mask import placeholder_mask as marked

        return marked(input_ids, placeholder_ids).view(-1)
    if isinstance(placeholder_ids, int):
        placeholder_ids = (placeholder_ids,)
    ids = list(placeholder_ids)
    if not ids:
        raise KernelInputError("placeholder_ids is empty")
    mask = input_ids == ids[0]
    for other in ids[1:]:
        mask |= input_ids == other
    return mask


def _placeholder_counts(mask):
    """Inclusive running count of placeholders: token t, if a placeholder, takes row ``count[t] - 1``."""
    import torch

    return torch.cumsum(mask, 0, dtype=torch.int64)


def merge_by_placeholder_ids_ref(input_ids, placeholder_ids, embeddings, input_embeds):
    """Plain-torch reference (and CPU fallback) of ``merge_by_placeholder_ids``; sync-free
    too, at the price of ``[tokens, H]`` temporaries."""
    import torch

    flat_ids = input_ids.reshape(-1)
    out = input_embeds.view(-1, input_embeds.shape[-1])
    mask = placeholder_mask(flat_ids, placeholder_ids)
    n_mm = embeddings.shape[0]
    if n_mm == 0 or flat_ids.numel() == 0:
        return input_embeds
    rank = _placeholder_counts(mask) - 1
    take = mask & (rank < n_mm)
    rows = embeddings[rank.clamp(0, n_mm - 1)].to(out.dtype)
    out.copy_(torch.where(take[:, None], rows, out))
    return input_embeds


def embed_with_placeholders_ref(input_ids, weight, embeddings, placeholder_ids, out):
    """Plain-torch reference (and CPU fallback) of ``embed_with_placeholders``."""
    import torch

    flat_ids = input_ids.reshape(-1)
    flat_out = out.view(-1, out.shape[-1])
    if flat_ids.numel() == 0:
        return out
    mask = placeholder_mask(flat_ids, placeholder_ids)
    vocab = weight.shape[0]
    text_ok = ~mask & (flat_ids >= 0) & (flat_ids < vocab)
    zeros = torch.zeros((), dtype=out.dtype, device=out.device)
    if vocab:
        text = weight[torch.where(text_ok, flat_ids, 0)].to(out.dtype)
        value = torch.where(text_ok[:, None], text, zeros)
    else:
        value = zeros.expand(flat_out.shape)
    n_mm = embeddings.shape[0]
    if n_mm:
        rank = _placeholder_counts(mask) - 1
        take = mask & (rank < n_mm)
        value = torch.where(take[:, None], embeddings[rank.clamp(0, n_mm - 1)].to(out.dtype), value)
    flat_out.copy_(value)
    return out


def _check_common(input_ids, embeddings, dest, tables) -> None:
    import torch

    if (
        input_ids.dtype.is_floating_point
        or input_ids.dtype.is_complex
        or input_ids.dtype == torch.bool
    ):
        raise KernelInputError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
    if tuple(dest.shape[:-1]) != tuple(input_ids.shape):
        raise KernelInputError(
            f"input_embeds/out has shape {tuple(dest.shape)}; expected {tuple(input_ids.shape)} + (hidden,)"
        )
    hidden = dest.shape[-1]
    for name, t in [("embeddings", embeddings), *tables]:
        if t.dim() != 2 or t.shape[1] != hidden:
            raise KernelInputError(f"{name} must be [rows, {hidden}], got shape {tuple(t.shape)}")
    for name, t in [
        ("input_ids", input_ids),
        ("embeddings", embeddings),
        ("output", dest),
        *tables,
    ]:
        if t.device != dest.device:
            raise KernelInputError(
                f"{name} is on {t.device}, the output on {dest.device}; move it with .to() first"
            )
        if not t.is_contiguous():
            raise KernelInputError(f"{name} is not contiguous; call .contiguous() on it first")
    for name, t in [("embeddings", embeddings), ("output", dest), *tables]:
        if not t.dtype.is_floating_point:
            raise KernelInputError(f"{name} must be floating point, got {t.dtype}")


def _check_values(mask, input_ids, embeddings, vocab: int | None) -> None:
    """The optional ``check=True`` validation: on the host for CPU tensors, queued on the device otherwise."""
    import torch

    n_placeholders = mask.sum()
    ids_bad = None
    if vocab is not None:
        ids_bad = (~mask & ((input_ids < 0) | (input_ids >= vocab))).any()
    if mask.device.type == "cpu":
        if int(n_placeholders) != embeddings.shape[0]:
            raise EmbeddingLengthMismatch(
                expected=int(n_placeholders),
                received=embeddings.shape[0],
                what="multimodal embedding rows for the placeholder tokens in input_ids",
            )
        if ids_bad is not None and bool(ids_bad):
            raise KernelInputError(
                f"input_ids holds non-placeholder ids outside the vocabulary [0, {vocab})"
            )
        return
    torch._assert_async(
        n_placeholders == embeddings.shape[0],
        f"placeholder token count differs from the {embeddings.shape[0]} multimodal embedding rows",
    )
    if ids_bad is not None:
        torch._assert_async(
            ~ids_bad, f"input_ids holds non-placeholder ids outside the vocabulary [0, {vocab})"
        )


def _launch(*, input_ids, mask, counts, weight, embeddings, out, lookup_text, config):
    n_tokens = input_ids.numel()
    hidden = out.shape[-1]
    dtypes = [out.dtype, embeddings.dtype] + ([weight.dtype] if lookup_text else [])
    for dtype in dtypes:
        if str(dtype).removeprefix("torch.") not in SUPPORTED_DTYPES:
            raise KernelInputError(
                f"dtype {dtype} is not supported by the Triton kernel (bfloat16, float16, float32);"
                " set MM_SCHEDULE_KERNEL_BACKEND=torch for other dtypes"
            )
    itemsizes = [d.itemsize for d in dtypes]
    vec = vector_width(*itemsizes)
    tensors = [out, embeddings] + ([weight] if lookup_text else [])
    aligned = hidden % vec == 0 and all(t.data_ptr() % 16 == 0 for t in tensors)
    cfg = resolve_config(
        KERNEL_NAME,
        dtype=out.dtype,
        hidden=hidden,
        n_rows=n_tokens,
        device=out.device,
        config=config,
    )
    if not aligned:
        cfg = unaligned_config(cfg)
        vec = 1
    grid = (triton.cdiv(n_tokens, cfg["BLOCK_M"]),)
    # Triton launches on the current device and its current stream: make that the output's.
    with layer(out.device).guard(out.device):
        _launch_on_device(grid, input_ids, mask, counts, weight, embeddings, out, lookup_text, cfg, vec)


def _launch_on_device(grid, input_ids, mask, counts, weight, embeddings, out, lookup_text, cfg, vec):
    import torch

    hidden = out.shape[-1]
    n_tokens = input_ids.numel()
    placeholder_merge_kernel[grid](
        input_ids,
        mask.view(torch.uint8),
        counts,
        weight if lookup_text else embeddings,
        embeddings,
        out,
        n_tokens,
        weight.shape[0] if lookup_text else 0,
        embeddings.shape[0],
        hidden // vec,
        LOOKUP_TEXT=lookup_text,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_H=cfg["BLOCK_H"],
        VEC=vec,
        EVEN_H=hidden % cfg["BLOCK_H"] == 0,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def merge_by_placeholder_ids(
    input_ids,
    placeholder_ids: int | Sequence[int],
    embeddings,
    input_embeds,
    *,
    check: bool = False,
    config: dict | None = None,
):
    """Write ``embeddings`` into ``input_embeds`` at the placeholder tokens, in place, and
    return ``input_embeds``. The k-th placeholder (in flattened order) takes row k.

    ``input_ids`` is ``[...]`` and ``input_embeds`` ``[..., H]`` of the same leading shape;
    ``placeholder_ids`` is an id, a sequence of ids, or a tensor of ids. Rows are cast to
    ``input_embeds.dtype``.

    Equivalent PyTorch (when the counts match; this op never syncs)::

        mask = torch.isin(input_ids, torch.tensor(placeholder_ids))
        input_embeds[mask] = embeddings.to(input_embeds.dtype)
    """
    if embeddings.dim() != 2:
        raise KernelInputError(
            f"embeddings must be [rows, hidden], got shape {tuple(embeddings.shape)}"
        )
    _check_common(input_ids, embeddings, input_embeds, [])
    return _merge(
        input_ids, placeholder_ids, embeddings, input_embeds, weight=None, check=check,
        config=config,
        reference=lambda: merge_by_placeholder_ids_ref(input_ids, placeholder_ids, embeddings, input_embeds),
    )  # fmt: skip


def embed_with_placeholders(
    input_ids,
    weight,
    embeddings,
    placeholder_ids: int | Sequence[int],
    *,
    out=None,
    check: bool = False,
    config: dict | None = None,
):
    """Text-embedding lookup with the multimodal rows merged in, in one pass.

    Returns ``out`` (allocated as ``[*input_ids.shape, H]`` in ``weight.dtype`` when not
    given): text tokens take ``weight[id]``, the k-th placeholder token takes
    ``embeddings[k]`` (both cast to ``out.dtype``). Placeholder ids may lie outside the
    vocabulary; a text id outside ``[0, vocab)`` yields a zero row (an error with
    ``check=True``), and so does a placeholder with no embedding row left.

    Equivalent PyTorch (when ids and counts are valid)::

        mask = torch.isin(input_ids, torch.tensor(placeholder_ids))
        out = F.embedding(input_ids.masked_fill(mask, 0), weight)   # a copy: input_ids is untouched
        out[mask] = embeddings.to(out.dtype)
    """
    import torch

    if weight.dim() != 2:
        raise KernelInputError(f"weight must be [vocab, hidden], got shape {tuple(weight.shape)}")
    if out is None:
        out = torch.empty(
            (*input_ids.shape, weight.shape[1]), dtype=weight.dtype, device=weight.device
        )
    _check_common(input_ids, embeddings, out, [("weight", weight)])
    return _merge(
        input_ids, placeholder_ids, embeddings, out, weight=weight, check=check, config=config,
        reference=lambda: embed_with_placeholders_ref(input_ids, weight, embeddings, placeholder_ids, out),
    )  # fmt: skip


def _refuse_host_ids_under_capture(placeholder_ids, device) -> None:
    """Ids in a tensor on another device are copied to the output's on every call: a CUDA
    graph would replay that copy from a host buffer it does not own."""
    if (
        getattr(placeholder_ids, "device", device) != device
        and layer(device).capturing(device)
    ):
        raise GraphCaptureError(
            f"placeholder_ids is a tensor on {placeholder_ids.device} while a CUDA graph is captured"
            f" on {device}: its copy to the device cannot be replayed; pass the ids as Python ints"
            " or as a tensor already on the device"
        )


def _merge(input_ids, placeholder_ids, embeddings, out, *, weight, check, config, reference):
    """The two entry points' shared tail: optional value checks, then the torch reference
    or one launch (with ``weight``, text rows are looked up too). The mask is built once."""
    flat_ids = input_ids.reshape(-1)
    _refuse_host_ids_under_capture(placeholder_ids, out.device)
    mask = None
    if check:
        mask = placeholder_mask(flat_ids, placeholder_ids)
        vocab = None if weight is None else weight.shape[0]
        _check_values(mask, flat_ids, embeddings, vocab)
    if flat_ids.numel() == 0:
        return out
    if select_backend(out.device) == "torch":
        return reference()
    if mask is None:
        mask = placeholder_mask(flat_ids, placeholder_ids)
    _launch(
        input_ids=flat_ids,
        mask=mask,
        counts=_placeholder_counts(mask),
        weight=weight,
        embeddings=embeddings,
        out=out,
        lookup_text=weight is not None,
        config=config,
    )
    return out
