"""Which SGLang releases the stand-in knows, and the form each name of the module has in each.

Every release from 0.5.18 on has ``sglang.srt.managers.mm_schedule``. The module drifts
release by release; ``FORMS`` records, for each name whose signature or behaviour
changed, the release from which each form holds (``None``: the release's module lacks
the name). A release's *profile* is the form of every such name in it; the stand-in
binds, for a release, the implementation of each name's form (``standin.use_release``).
Names not listed keep one form in every known release.

Forms are named by the release that introduced them, except where a short word says
more. ``tests/integrations`` checks every profile against that release's own module.
"""

from __future__ import annotations

from dataclasses import dataclass

KNOWN = ("0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")

# name -> ((first release, form), ...), oldest first.
FORMS: dict[str, tuple[tuple[str, str | None], ...]] = {
    # Cached rows are checked against the item's token count; a mismatch is discarded.
    "_embedding_token_count": (("0.5.18", None), ("0.5.19", "0.5.19")),
    "_discard_mismatched_cached_embedding": (("0.5.18", None), ("0.5.19", "0.5.19")),
    # The cache keeps split views (charged their own rows), then clones them (0.5.20),
    # then also refuses an entry larger than its budget without evicting (0.5.23).
    "MultiModalStaticCache": (("0.5.18", "views"), ("0.5.20", "clones"), ("0.5.23", "refuses oversize")),
    # A miss wholly inside the chunk whose CUDA-IPC feature may be deferred is marked borrowed.
    "BORROW_CUDA_IPC_FEATURE_KEY": (("0.5.18", None), ("0.5.20", "0.5.20")),
    # The batch's table of whole embeddings is keyed by hash, then by (hash, token count) (0.5.19).
    "_batch_encode_per_image_misses": (("0.5.18", "hash keys"), ("0.5.19", "spans"), ("0.5.20", "borrows"),
                                       ("0.5.22", "token counts")),
    # Features offloaded to the host are waited for through this event.
    "host_offload_event": (("0.5.18", None), ("0.5.21", "0.5.21")),
    "_move_items_to_device": (("0.5.18", "items, device"), ("0.5.21", "items, device, data_embedding_func")),
    "_get_precomputed_embedding": (("0.5.18", "by request"), ("0.5.21", "waits"), ("0.5.22", "by item")),
    # Cache hits acknowledge deferred CUDA-IPC features (until 0.5.22, which keeps the leases).
    "_acknowledge_deferred_cuda_ipc_cache_hits": (("0.5.18", "0.5.18"), ("0.5.22", None)),
    "get_parallel": (("0.5.18", "0.5.18"), ("0.5.22", None)),
    "_get_chunked_embedding_full": (("0.5.18", "acknowledges hits"), ("0.5.22", "keeps leases")),
    # Items are sliced by their own offsets (an audio item may have several runs), into lists.
    "_item_overlap": (("0.5.18", None), ("0.5.22", "0.5.22")),
    "_slice_item_chunk": (("0.5.18", None), ("0.5.22", "0.5.22")),
    "PerImageRequestInfo": (("0.5.18", "spans"), ("0.5.22", "token counts")),
    "_get_chunked_embedding_by_item": (("0.5.18", "items_offset"), ("0.5.22", "slices")),
    "_assemble_per_image_chunk": (("0.5.18", "hash keys"), ("0.5.19", "tensor"), ("0.5.22", "slices")),
    "_get_chunked_prefill_embedding": (("0.5.18", "0.5.18"), ("0.5.22", "slices"), ("0.5.23", "window")),
    "_get_multimodal_mask": (("0.5.18", "isin"), ("0.5.23", "sorted")),
}


def version_key(version: str) -> tuple:
    """A sort key for release strings: numeric parts compare as numbers, a local or
    pre-release suffix (``0.5.24rc1``, ``0.5.23+fork``) sorts with its base release."""
    parts = []
    for piece in version.replace("+", ".").replace("-", ".").split("."):
        digits = len(piece) - len(piece.lstrip("0123456789"))
        parts.append(int(piece[:digits]) if digits else -1)
    return tuple(parts)


@dataclass(frozen=True)
class Profile:
    """The form of every name of ``FORMS`` in one release (``None``: absent)."""

    version: str
    forms: dict[str, str | None]

    def has(self, name: str) -> bool:
        return self.forms.get(name, "") is not None

    def form(self, name: str) -> str | None:
        return self.forms[name]


def profile(version: str) -> Profile:
    """The profile of a known release, or of the newest known release not newer than
    ``version`` (the nearest one an unknown build is verified against)."""
    base = nearest(version)
    key = version_key(base)
    forms = {}
    for name, history in FORMS.items():
        forms[name] = [form for since, form in history if version_key(since) <= key][-1]
    return Profile(version=base, forms=forms)


def nearest(version: str) -> str:
    """``version`` if known, else the newest known release not newer than it (the oldest
    known for an older build)."""
    if version in KNOWN:
        return version
    older = [v for v in KNOWN if version_key(v) <= version_key(version)]
    return older[-1] if older else KNOWN[0]


PROFILES = {version: profile(version) for version in KNOWN}
NEWEST = KNOWN[-1]
