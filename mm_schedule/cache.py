"""A byte-bounded LRU cache of encoder outputs, safe to share between threads.

Keys are integers: an item's hash for per-item entries, ``combine_hashes`` of a
request's item hashes for whole-request entries (SGLang's two key spaces).

Accounting charges what an entry really keeps alive: the bytes of its tensor's
*storage*. A view whose storage is larger than its payload (a slice of a batched
encoder output) is cloned first, so caching one image never pins a whole batch.

``set`` on a key that is already present replaces the value and refreshes its
recency (SGLang keeps the old value instead; replacing is what a caller re-encoding
a mismatched entry wants). An entry larger than the whole budget is rejected
without evicting anything. Entries pinned by a step in progress are never evicted.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


def combine_hashes(hashes: Sequence[int]) -> int | None:
    """The whole-request key for a list of item hashes (None for an empty list).

    Python's ``hash`` of a tuple of ints is deterministic across processes
    (``PYTHONHASHSEED`` only salts str and bytes), so every rank agrees on it.
    """
    if not hashes:
        return None
    return hash(tuple(hashes))


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    insertions: int
    evictions: int
    rejected: int
    discarded: int
    bytes: int
    entries: int
    capacity_bytes: int

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(kw_only=True)
class EmbeddingResult:
    """Wrapper SGLang's cache API passes around (``.embedding`` is the tensor)."""

    embedding: Any


def _unwrap(value: Any) -> Any:
    return getattr(value, "embedding", value)


def _storage_bytes(tensor: Any) -> int:
    return tensor.untyped_storage().nbytes()


def _payload_bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


class EmbeddingCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[int, tuple[Any, int]] = OrderedDict()  # key -> (value, charged bytes)
        self._pins: Counter[int] = Counter()
        self._bytes = 0
        self._lock = threading.RLock()
        self._hits = self._misses = self._insertions = 0
        self._evictions = self._rejected = self._discarded = 0

    # -- our API ---------------------------------------------------------------------
    def lookup(self, key: int) -> Any | None:
        """The tensor cached under ``key`` (refreshing its recency), or None. Counts a hit or miss."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return _unwrap(entry[0])

    def insert(self, key: int, value: Any) -> bool:
        """Cache ``value`` (a tensor, or an object with ``.embedding``). Returns False when
        it cannot fit without evicting pinned entries or exceeds the whole budget."""
        tensor = _unwrap(value)
        if _storage_bytes(tensor) > _payload_bytes(tensor):
            tensor = tensor.clone()
            value = tensor if value is _unwrap(value) else _replace_embedding(value, tensor)
        size = _storage_bytes(tensor)
        with self._lock:
            old = self._entries.get(key)
            reclaim = old[1] if old is not None else 0
            if size > self.max_bytes or not self._make_room(size - reclaim, keep=key):
                self._rejected += 1
                return False
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, size)
            self._entries.move_to_end(key)
            self._bytes += size
            self._insertions += 1
            return True

    def discard(self, key: int) -> bool:
        """Drop an entry found to be wrong (e.g. a row-count mismatch after a hash collision)."""
        with self._lock:
            if self._pop(key):
                self._discarded += 1
                return True
            return False

    def contains(self, key: int) -> bool:
        with self._lock:
            return key in self._entries

    @contextmanager
    def pin(self, keys: Iterable[int]) -> Iterator[None]:
        """Keep ``keys`` from being evicted while a step that uses them is assembled."""
        keys = list(keys)
        with self._lock:
            self._pins.update(keys)
        try:
            yield
        finally:
            with self._lock:
                self._pins.subtract(keys)
                self._pins += Counter()  # drop zero counts

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                insertions=self._insertions,
                evictions=self._evictions,
                rejected=self._rejected,
                discarded=self._discarded,
                bytes=self._bytes,
                entries=len(self._entries),
                capacity_bytes=self.max_bytes,
            )

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return self.contains(key)

    # -- SGLang MultiModalStaticCache-compatible surface -------------------------------
    @staticmethod
    def combine_hashes(mm_hashes: Sequence[int]) -> int | None:
        return combine_hashes(mm_hashes)

    def get(self, mm_hashes: Sequence[int], combined_hash: int | None = None) -> Any | None:
        return self.get_single(combine_hashes(list(mm_hashes)))

    def get_single(self, mm_hash: int) -> Any | None:
        with self._lock:
            entry = self._entries.get(mm_hash)
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end(mm_hash)
            self._hits += 1
            value = entry[0]
        return value if hasattr(value, "embedding") else EmbeddingResult(embedding=value)

    def set(self, mm_hash: int, embedding: Any, loc: Any = None) -> bool:
        return self.insert(mm_hash, embedding)

    def has(self, mm_hash: int) -> bool:
        return self.contains(mm_hash)

    def free(self, mm_hash: int, allocator: Any = None) -> bool:
        with self._lock:
            return self._pop(mm_hash)

    def available_size(self) -> int:
        """Entry count, as SGLang's cache reports it (despite the name)."""
        return len(self)

    @property
    def current_size(self) -> int:
        return self.stats().bytes

    # -- internals (caller holds the lock) ----------------------------------------------
    def _pop(self, key: int) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._bytes -= entry[1]
        return True

    def _make_room(self, needed: int, *, keep: int) -> bool:
        """Evict unpinned LRU entries until ``needed`` more bytes fit. Decides first, so a
        request that cannot be satisfied evicts nothing."""
        excess = self._bytes + needed - self.max_bytes
        if excess <= 0:
            return True
        victims, freed = [], 0
        for key, (_, size) in self._entries.items():
            if key == keep or self._pins[key] > 0:
                continue
            victims.append(key)
            freed += size
            if freed >= excess:
                break
        if freed < excess:
            return False
        for key in victims:
            self._pop(key)
            self._evictions += 1
        return True


def _replace_embedding(value: Any, tensor: Any) -> Any:
    import copy

    clone = copy.copy(value)
    clone.embedding = tensor
    return clone
