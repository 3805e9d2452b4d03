"""Which SGLang releases the stand-in matches, and what a newer one changed.

A release is *matched* when every module-level name its ``mm_schedule`` defines exists
in the stand-in with a compatible signature (``tests/integrations`` checks this against
each release's own module, from its wheel). ``install()`` accepts matched releases only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Release:
    version: str
    matched: bool
    # For a release that is not matched: what its module has that the stand-in does not.
    missing: tuple[str, ...] = field(default=())


RELEASES = (
    # 0.5.18 is 0.5.19 without _embedding_token_count and _discard_mismatched_cached_embedding.
    Release("0.5.18", matched=True),
    Release("0.5.19", matched=True),
    Release("0.5.23", matched=False, missing=(
        "_move_items_to_device(items, device, data_embedding_func): takes the encoder and waits on"
        " host_offload_event before moving",
        "_get_chunked_embedding_by_item(data_embedding_func, embedding_items_per_req, extend_prefix_len,"
        " extend_seq_len, device): no items_offset (each item's own offsets), returns a list of slices",
        "_assemble_per_image_chunk returns a list of slices instead of one tensor",
        "PerImageRequestInfo.overlapping holds (index, item, token_count) triples",
        "_get_precomputed_embedding slices each item by its own offsets",
        "_get_chunked_prefill_embedding sends audio items with several runs down the per-image path",
        "cache hits are no longer acknowledged to the CUDA-IPC transport"
        " (_acknowledge_deferred_cuda_ipc_cache_hits removed; BORROW_CUDA_IPC_FEATURE_KEY marks borrowed features)",
    )),
)

MATCHED = tuple(r.version for r in RELEASES if r.matched)
