"""Drop-ins for vLLM's masked merge (``vllm/model_executor/models/utils.py``).

``_merge_multimodal_embeddings(inputs_embeds, multimodal_embeddings, is_multimodal)``
and the older public ``merge_multimodal_embeddings(input_ids, inputs_embeds,
multimodal_embeddings, placeholder_token_id)`` with vLLM's signatures and results:
``inputs_embeds`` updated in place at the true rows of the mask (the ``k``-th true row
takes the ``k``-th multimodal row, cast to ``inputs_embeds``' dtype) and returned.

Instead of a boolean index (a prefix sum over the mask and a copy per element), the
mask becomes runs of consecutive true rows on the host and the rows one segment table,
copied in one launch with no flattened copy of the embeddings first. A CPU mask (what
vLLM's model runner passes) costs no device sync; a mask on the GPU is read back once.
A count mismatch raises ``EmbeddingLengthMismatch`` (a ``ValueError``, as vLLM's) before
anything is written, naming both counts and the shapes that made them.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    import numpy as np  # vLLM depends on it; without it the mask is read with torch calls
except ImportError:
    np = None

from ._engine import (
    EmbeddingLengthMismatch,
    KernelInputError,
    SegmentTable,
    copy_segments,
    one_dtype,
    plain_rows,
)
from .releases import installed_release_checked


def _flatten(embeddings, out: list) -> None:
    if isinstance(embeddings, torch.Tensor):
        if embeddings.dim() < 2:
            raise KernelInputError(f"a multimodal embedding must be [..., hidden], got shape {tuple(embeddings.shape)}")
        out.append(embeddings if embeddings.dim() == 2 else embeddings.flatten(0, -2))
        return
    for inner in embeddings:
        _flatten(inner, out)


def _count_expression(sources: list) -> str:
    return " + ".join(str(t.shape[0]) for t in sources[:16]) + (" + ..." if len(sources) > 16 else "")


def mask_runs(is_multimodal) -> tuple[list[int], list[int]]:
    """``(starts, ends)`` of the runs of true entries of a 1-D bool mask, half-open."""
    mask = is_multimodal.reshape(-1)
    if np is not None and mask.device.type == "cpu":
        padded = np.zeros(mask.shape[0] + 2, dtype=np.int8)
        padded[1:-1] = mask.numpy()
        edges = np.diff(padded)
        return np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()
    mask = mask.to(torch.int8)
    edges = torch.diff(mask, prepend=mask.new_zeros(1), append=mask.new_zeros(1))
    if edges.device.type != "cpu":
        edges = edges.cpu()  # the one read-back of a device mask
    return edges.eq(1).nonzero().flatten().tolist(), edges.eq(-1).nonzero().flatten().tolist()


def _merge_multimodal_embeddings(inputs_embeds, multimodal_embeddings: Any, is_multimodal):
    """vLLM's ``_merge_multimodal_embeddings``: see the module docstring."""
    installed_release_checked()
    if len(multimodal_embeddings) == 0:
        return inputs_embeds
    if is_multimodal.dtype != torch.bool:
        raise KernelInputError(f"is_multimodal must be a bool mask, got dtype {is_multimodal.dtype} (an integer"
                               " tensor would index rows, not mask them)")
    sources: list = []
    _flatten(multimodal_embeddings, sources)
    starts, ends = mask_runs(is_multimodal)
    placeholders = sum(ends) - sum(starts)
    n_rows = sum(t.shape[0] for t in sources)
    if n_rows != placeholders:
        raise EmbeddingLengthMismatch(
            expected=placeholders, received=n_rows, what="multimodal rows for the placeholder rows of is_multimodal",
            hint=f"attempted to assign {_count_expression(sources)} = {n_rows} rows to {placeholders} placeholders")
    if not n_rows:
        return inputs_embeds
    flat = inputs_embeds.reshape(-1, inputs_embeds.shape[-1]) if inputs_embeds.dim() != 2 else inputs_embeds
    if is_multimodal.numel() != flat.shape[0]:
        raise KernelInputError(f"is_multimodal has {is_multimodal.numel()} entries, inputs_embeds {flat.shape[0]} rows")
    if not flat.is_contiguous() or flat.data_ptr() != inputs_embeds.data_ptr() or flat.is_neg():
        # Not writable as raw rows through a flat view: vLLM's own boolean index works on any
        # layout (and writes a negated view's values, not its bytes).
        inputs_embeds[is_multimodal] = torch.cat(sources).to(dtype=inputs_embeds.dtype)
        return inputs_embeds
    for t in sources:
        if t.shape[1] != flat.shape[1] or t.device != flat.device or not t.is_floating_point():
            raise KernelInputError(f"a multimodal embedding of shape {tuple(t.shape)}, dtype {t.dtype} on {t.device}"
                                   f" cannot go into inputs_embeds of shape {tuple(flat.shape)} on {flat.device}"
                                   " (floating-point rows of its hidden size on its device are needed)")
    sources = [t if t.is_contiguous() and not t.is_neg() else plain_rows(t) for t in sources]
    if len({t.dtype for t in sources}) > 1:
        sources = one_dtype(sources, flat.dtype)
    copy_segments(sources, _table(sources, starts, ends), flat)
    return inputs_embeds


def _table(sources: list, starts: list[int], ends: list[int]) -> SegmentTable:
    """Segments where the sources' rows (in order) meet the mask's runs (in order)."""
    seg_src, seg_row, seg_n, seg_dst = [], [], [], []
    s, row = 0, 0  # current source and its next row
    for start, end in zip(starts, ends):
        while start < end:
            size = sources[s].shape[0]
            if row == size:
                s, row = s + 1, 0
                continue
            n = min(end - start, size - row)
            seg_src.append(s)
            seg_row.append(row)
            seg_n.append(n)
            seg_dst.append(start)
            start += n
            row += n
    return SegmentTable(seg_src, seg_row, seg_n, seg_dst)


def merge_multimodal_embeddings(input_ids, inputs_embeds, multimodal_embeddings: Any,
                                placeholder_token_id: int | list[int]):
    """vLLM's former public ``merge_multimodal_embeddings``: the placeholder rows are
    where ``input_ids`` equals ``placeholder_token_id`` (or any id of a list, whose rows
    ``multimodal_embeddings`` must then contain in prompt order)."""
    if isinstance(placeholder_token_id, list):
        ids = torch.tensor(placeholder_token_id, dtype=input_ids.dtype, device=input_ids.device)
        mask = torch.isin(input_ids, ids)
    else:
        mask = input_ids == placeholder_token_id
    return _merge_multimodal_embeddings(inputs_embeds, multimodal_embeddings, mask)
