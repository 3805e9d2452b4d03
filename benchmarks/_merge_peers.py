"""The peers' multimodal merge op sequences, re-implemented in plain torch.

Each function does what the named serving stack does in one prefill step, from the
point where the cached encoder outputs exist to the point where ``input_embeds`` holds
the multimodal rows. They start from the same inputs our kernels get (the cache
entries and where their rows go), so every copy, mask and sync the peer pays is inside
the function. Which release each one mirrors is in its docstring; the facts come from
/shared/reference (kernel_anchors.md §1–3, sglang_semantics.md §5).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def concat_views(views: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Copy #1 of every peer: the step's slices of cached outputs (views) concatenated.

    vLLM's runner slices ``encoder_output[a:b]`` per item and ``_flatten_embeddings``
    concatenates; SGLang's chunked-prefill path slices and ``torch.concat``s. The cast to
    the text embedding dtype, when needed, is a further pass (vLLM and SGLang both cast).
    """
    flat = torch.cat(list(views))
    return flat if flat.dtype == dtype else flat.to(dtype)


def masked_scatter_merge(embeds: torch.Tensor, views, mask: torch.Tensor) -> torch.Tensor:
    """vLLM from PR #22105 (Aug 2025) until PR #34246: ``masked_scatter_`` with the
    ``[tokens]`` device mask broadcast over H. SGLang 0.5.17/0.5.18 run the same two ops
    (``dest.masked_scatter_(mask.expand_as(dest), src)``)."""
    embeds.masked_scatter_(mask.unsqueeze(-1), concat_views(views, embeds.dtype))
    return embeds


def index_put_merge(embeds: torch.Tensor, views, mask: torch.Tensor) -> torch.Tensor:
    """vLLM before PR #22105 (early 2025): a ``mask.sum().item()`` count check, then
    boolean index_put ``embeds[mask] = flat``, whose ``nonzero`` syncs the host again.
    Older SGLang (``torch.where`` then index_put) pays the same kind of sync."""
    flat = concat_views(views, embeds.dtype)
    placeholders = int(mask.sum().item())
    if placeholders != flat.shape[0]:
        raise ValueError(f"Attempted to assign {flat.shape[0]} multimodal tokens to {placeholders} placeholders")
    embeds[mask] = flat
    return embeds


def index_put_host_mask_merge(embeds: torch.Tensor, views, mask_host: torch.Tensor) -> torch.Tensor:
    """vLLM after PR #34246 (Feb 2026): the same boolean index_put with the mask left on
    the host; since torch 2.9 the host mask becomes indices without a stream sync."""
    embeds[mask_host] = concat_views(views, embeds.dtype)
    return embeds


def cumsum_index_copy_merge(embeds: torch.Tensor, views, mask: torch.Tensor) -> torch.Tensor:
    """SGLang 0.5.19+ (``_scatter_mm_embedding``, PR #37070) after its ``torch.concat``:
    source row k goes to the k-th masked row, found by a running count of the mask.

    Unmasked rows all point at one extra slot that is dropped; slots no masked row
    claims keep an out-of-range row number, so surplus source rows fail inside
    ``index_copy_`` rather than landing anywhere (and, as in SGLang, a source exactly
    one row short goes unnoticed: the last masked row keeps its text embedding).
    """
    src = concat_views(views, embeds.dtype)
    flags = mask.reshape(-1)
    n_src, n_dest = src.shape[0], embeds.shape[0]
    slot = torch.where(flags, torch.cumsum(flags, 0) - 1, n_src)
    rows = torch.full((n_src + 1,), n_dest, dtype=torch.long, device=embeds.device)
    rows.scatter_(0, slot, torch.arange(n_dest, device=embeds.device))
    embeds.index_copy_(0, rows[:n_src], src)
    return embeds


def hf_merge(embeds: torch.Tensor, views, mask: torch.Tensor) -> torch.Tensor:
    """HF transformers (LLaVA / Qwen2-VL ``get_placeholder_mask`` pattern): the mask
    expanded to ``[tokens, H]``, a count check through ``embeds[mask].numel()`` (a
    boolean-index copy and a host sync), then an out-of-place ``masked_scatter``."""
    features = torch.cat(list(views))
    expanded = mask.unsqueeze(-1).expand_as(embeds)
    if embeds[expanded].numel() != features.numel():
        raise ValueError("Image features and image tokens do not match")
    return embeds.masked_scatter(expanded, features.to(embeds.device, embeds.dtype))


def copy_loop(dest: torch.Tensor, sources: Sequence[torch.Tensor], table) -> torch.Tensor:
    """One ``copy_`` per segment ``(source, src_row, n_rows, dst_row)``: a launch each."""
    for source, src_row, n_rows, dst_row in table:
        dest[dst_row : dst_row + n_rows].copy_(sources[source][src_row : src_row + n_rows])
    return dest
