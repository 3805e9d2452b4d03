"""A byte-bounded LRU cache of encoder outputs, safe to share between threads.

Keys are ints: an item's key for per-item entries, ``combine_hashes`` of a request's
item keys for whole-request entries (SGLang's two key spaces); ``keys.py`` says which
item hashes are accepted.

An entry is stored once, in the form a step reads it: a detached 2-D ``[rows, H]``
tensor, with its row count and the bytes it is charged for recorded at insertion, so a
step's lookups touch no tensor. A step looks up all its keys under one lock
(``lookup_many``) and inserts all its validated encoder outputs under one lock
(``insert_many``), keeping the step's own hits from being evicted by its inserts.

Accounting charges what an entry really keeps alive: the bytes of its tensor's
*storage*. A view whose storage is larger than its payload (a slice of a batched
encoder output) is cloned first, so caching one image never pins a whole batch.
``share_storage=True`` keeps every tensor as given instead (SGLang 0.5.19's rule, for its
behaviour on request): a view pins the whole output it came from but is charged for
its own rows only, so the budget undercounts what the cache keeps alive.

Inserting under a key that is present replaces the value and refreshes its recency
(SGLang keeps the old value; replacing is what re-encoding a discarded entry wants).
An entry larger than the whole budget is rejected without evicting anything.

What a modality's entries look like is the cache's to know, not the step's to guess: the
hidden size and dtype of each modality are declared by the caller (``hidden_sizes=``,
``dtypes=``, kept for good) or learned from the entries of the modality the cache holds.
A learned layout is only as good as the outputs it came from, so it lasts as long as
they do: once no entry of it is held (evicted, discarded, freed) it is forgotten, and
the next outputs of the modality set it again (the log says when that changes it). A
change is provisional until three inserts have brought the same layout: meanwhile its entries
are not served (the next step encodes them again) and outputs of the layout it replaced
undo it, so one faulty output that met no entry of its modality decides nothing alone.
``insert_many`` refuses, under its lock, a batch whose tensors disagree with a declared
layout, with the layout of held entries, or with each other (``CacheLayoutError``,
nothing inserted or evicted), so a faulty output cannot poison the cache, whichever
item happens to come first. A step that proves its size (the ``input_embeds`` it is
merged into) passes ``replace_learned=True``: held entries of a learned layout of
another hidden size can never serve it, so they are evicted and the layout replaced.

An encoder that writes every call into one reused buffer would overwrite the entry
cached by reference from its previous call. ``insert_many`` (and ``insert``/``set``)
notices a tensor whose storage an entry already holds, copies it, evicts the overwritten
entry, says so once in the log, and from then on copies every tensor of that storage.

A value given to ``set`` as an object with ``.embedding`` (SGLang's ``EmbeddingResult``,
an EVS result) is kept rebuilt around the entry's own tensor, never as given: the
caller's object would keep its tensor alive (a view pins its whole batch uncharged, a
graph stays attached, a reused buffer is served after being overwritten). ``get_single``
serves that rebuilt value, whose storage is exactly what the entry is charged for.
``ForModality(value, modality)`` is how a value set without ``insert_many`` is held to
its modality's layout.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from copy import copy as _shallow_copy
from dataclasses import dataclass, is_dataclass, replace
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import Any

from .errors import CacheConfigError, CacheLayoutError, CacheStateError
from .items import modality_name
from .keys import combine_hashes

try:
    from ._cache_hits import all_hits as _all_hits
except ImportError:  # installed without a C compiler: the Python passes answer alone
    _all_hits = None

log = logging.getLogger(__name__)

# An entry: (2-D tensor, rows, charged bytes, the value given to the SGLang-style ``set``
# rebuilt around the entry's tensor (``_kept_value``), layout, modality, address of its first
# row). A layout is (hidden size, dtype, device): what assembly needs to agree on; the
# modality (or None, for entries set without one) keys the per-modality layouts. The address
# (0 on meta) lets a step of cache hits copy their rows without reading a tensor on the host;
# an entry's tensor is the cache's own and never moves (an entry is replaced, not changed).
_TENSOR, _ROWS, _BYTES, _VALUE, _LAYOUT, _MODALITY, _ADDRESS = 0, 1, 2, 3, 4, 5, 6
_REUSED_STORAGES_KEPT = 256  # storages seen reused by their encoder, remembered (most recent)
# Inserts (steps) that must bring a changed learned layout before its entries are served: one
# faulty output, or two in a row, in a moment its modality held no entry decide nothing.
_CONFIRMING_INSERTS = 3
_tensor_of, _row_count, _charged = itemgetter(_TENSOR), itemgetter(_ROWS), itemgetter(_BYTES)
_modality_of, _address_of_entry = itemgetter(_MODALITY), itemgetter(_ADDRESS)
_first, _second = itemgetter(0), itemgetter(1)
_storage_of, _storage_bytes, _data_ptr = (methodcaller("untyped_storage"), methodcaller("nbytes"),
                                          methodcaller("data_ptr"))


def _address_of(tensor: Any) -> int:
    """The address of ``tensor``'s first element (0 for a tensor without data)."""
    return 0 if tensor.is_meta else tensor.data_ptr()


def _may_serve(held: str | None, wanted: str | None) -> bool:
    """An entry of modality ``held`` may serve a key asked for as ``wanted``."""
    return held is None or wanted is None or held == wanted


def _first_of_each(keys: list, entries: list, mods: list) -> list:
    """``(key, entry)`` of the first entry of each modality, in batch order: for entries of one
    layout, what checking every entry would find (the first of an unfit modality is named)."""
    if mods.count(mods[0]) == len(mods):
        return [(keys[0], entries[0])]
    seen, out = set(), []
    for key, entry, modality in zip(keys, entries, mods):
        if modality not in seen:
            seen.add(modality)
            out.append((key, entry))
    return out


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


@dataclass(frozen=True)
class ForModality:
    """A value for ``set`` / ``insert`` with the modality it embeds. SGLang's ``set`` has
    no modality argument; wrapped this way, a value is held to its modality's layout and
    counted in it, as ``insert_many(modalities=...)`` does."""

    value: Any
    modality: Any


def _unwrap(value: Any) -> Any:
    return value if hasattr(value, "shape") else getattr(value, "embedding", value)


def _kept_value(key: int, value: Any, tensor: Any) -> Any:
    """``value`` with ``.embedding`` replaced by the entry's own tensor (shaped as given).
    Keeping the caller's object would keep its tensor alive: a view pins the whole output
    it came from (uncharged), a tensor with a graph keeps the graph, and a reused encoder
    buffer would be served after the encoder overwrote it."""
    given = value.embedding
    if given is tensor:
        return value
    embedding = tensor
    if tuple(given.shape) != tuple(tensor.shape):
        try:
            embedding = tensor.view(given.shape)
        except RuntimeError:  # a shared view that cannot take the shape back: served 2-D
            embedding = tensor
    try:
        if is_dataclass(value):
            return replace(value, embedding=embedding)
        kept = _shallow_copy(value)
        kept.embedding = embedding
        return kept
    except (AttributeError, TypeError, ValueError) as exc:
        raise CacheStateError(
            f"key {key}: the cache keeps its own copy of an entry's embedding, and cannot build a"
            f" {type(value).__name__} around it ({exc}); set the tensor, or an EmbeddingResult"
        ) from None


def owns_storage(tensor: Any) -> bool:
    """True when ``tensor`` is contiguous and its storage holds nothing but its own rows."""
    return tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


def storage_id(tensor: Any) -> tuple | None:
    """Where ``tensor``'s memory lives, or None for tensors without data (``meta``)."""
    if tensor.is_meta:
        return None
    return tensor.device, tensor.untyped_storage().data_ptr()


def _byte_budget(max_bytes: Any) -> int:
    if isinstance(max_bytes, bool):  # an int to Python, never a byte count
        raise CacheConfigError(f"max_bytes must be a non-negative integer number of bytes, got {max_bytes!r}")
    try:
        value = operator.index(max_bytes)
    except TypeError:
        raise CacheConfigError(
            f"max_bytes must be a non-negative integer number of bytes, got {type(max_bytes).__name__} {max_bytes!r}"
        ) from None
    if value < 0:
        raise CacheConfigError(f"max_bytes must be >= 0, got {value}")
    return value


def _declared(what: str, value: Any, check) -> dict:
    """``hidden_sizes`` / ``dtypes`` as ``{modality name or None (every modality): value}``."""
    if value is None:
        return {}
    from .items import modality_name

    pairs = value.items() if hasattr(value, "items") else [(None, value)]
    out = {}
    for modality, v in pairs:
        if not check(v):
            raise CacheConfigError(f"{what}: {v!r} for modality {modality or 'every modality'} is not valid")
        out[None if modality is None else modality_name(modality)] = v
    return out


def _is_size(v: Any) -> bool:
    return type(v) is int and v > 0


def _is_dtype(v: Any) -> bool:
    return type(v).__name__ == "dtype" and getattr(v, "is_floating_point", False)


def _entry(tensor: Any, value: Any, modality: str | None = None, copy: bool = False, share: bool = False) -> tuple:
    """The entry for ``tensor``: detached, 2-D, owning exactly its storage (a copy when
    ``copy``); with ``share``, a view of the tensor as given, charged for its whole storage."""
    if tensor.dim() == 0:
        raise CacheStateError("an embedding has rows and a hidden size ([rows, hidden]), got a 0-d tensor")
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.is_neg():  # cached rows are copied as bytes, which a negated view's are not
        tensor = tensor.resolve_neg()
    if tensor.dim() != 2:
        tensor = tensor.reshape(-1, tensor.shape[-1])
    rows, hidden = tensor.shape
    size = tensor.untyped_storage().nbytes()
    if share and not copy:
        # Charged its own rows, as SGLang's cache charges a split view (it pins more).
        own = rows * hidden * tensor.element_size()
        return tensor, rows, own, value, (hidden, tensor.dtype, tensor.device), modality, _address_of(tensor)
    if copy or size != rows * hidden * tensor.element_size() or not tensor.is_contiguous():
        tensor = tensor.clone() if tensor.is_contiguous() else tensor.contiguous()
        size = tensor.untyped_storage().nbytes()
    return tensor, rows, size, value, (hidden, tensor.dtype, tensor.device), modality, _address_of(tensor)


def _count(counter: dict, value: Any, sign: int) -> None:
    count = counter.get(value, 0) + sign
    if count:
        counter[value] = count
    else:
        del counter[value]


class EmbeddingCache:
    """``max_bytes``: the budget (an int >= 0). ``hidden_sizes`` / ``dtypes``: what the
    entries of each modality must look like, one value for every modality or a mapping
    from modality (``"IMAGE"``, ``Modality.IMAGE``) to value; what is not declared is
    learned from the modality's held entries, and forgotten once none is held.
    ``share_storage``: keep tensors as given, views included (see the module docstring);
    outputs sharing one storage are then expected, not taken for a reused buffer."""

    def __init__(self, max_bytes: int, *, hidden_sizes: Any = None, dtypes: Any = None,
                 share_storage: bool = False) -> None:
        self.max_bytes = _byte_budget(max_bytes)
        if type(share_storage) is not bool:
            raise CacheConfigError(f"share_storage must be True or False, got {share_storage!r}")
        self.share_storage = share_storage
        self._hidden_sizes = _declared("hidden_sizes", hidden_sizes, _is_size)
        self._dtypes = _declared("dtypes", dtypes, _is_dtype)
        self._entries: OrderedDict[int, tuple] = OrderedDict()
        self._layouts: Counter[tuple] = Counter()
        # modality -> {(hidden, dtype): entries held}, over the held entries of that modality
        self._held: dict[str, dict] = {}
        self._forgotten: dict[str, tuple] = {}  # modality -> its last learned layout, once none is held
        # modality -> (layout it had, layout learned since, last insert that brought it, inserts
        # that did): a change of learned layout not yet confirmed (see _count_held)
        self._provisional: dict[str, tuple] = {}
        self._inserts = 0  # inserts so far, each a batch (which insert brought a layout)
        # modality -> {(hidden, dtype): (inserts that brought it while entries of the modality were
        # held, the last of them)}; a learned layout binds steps once _CONFIRMING_INSERTS brought
        # it, or a merged step proved it
        self._brought: dict[str, dict[tuple, tuple[int, int]]] = {}
        # modality -> layouts steps' outputs brought against their own hits of the modality's
        # unconfirmed learned layout (each such step refused); the next one such wins
        self._disputes: dict[str, frozenset] = {}
        self._grouped = 0  # depth of one_insert blocks (entered under the lock, by its holder)
        self._by_storage: dict[tuple, int] = {}  # storage id -> key of the entry holding it
        self._reused: OrderedDict[tuple, None] = OrderedDict()
        self._warned_reuse = False
        self._pins: Counter[int] = Counter()
        self._bytes = 0
        self._lock = threading.RLock()
        self._hits = self._misses = self._insertions = 0
        self._evictions = self._rejected = self._discarded = 0

    # -- what a step uses ----------------------------------------------------------------
    def lookup_many(self, keys: Sequence[int], rows: Sequence[int],
                    modalities: Sequence[str | None] | None = None) -> tuple[list[Any], tuple | None]:
        """The cached 2-D tensor for each key, or None, under one lock; refreshes recency
        and counts hits and misses. An entry whose row count is not ``rows[i]`` is a
        different embedding under the same key (a truncated-hash collision, a model
        change): it is discarded, logged, and reported as a miss. With ``modalities``, an
        entry of another modality than ``modalities[i]`` (one hash used for an image and
        for a video) is not served either: it is reported as a miss, logged, and replaced
        by what the step encodes, so the rows a request gets follow its own item, never
        whichever item happened to be cached under the hash (entries set without a
        modality serve any).

        Also returns the layout ``(hidden, dtype, device)`` every entry of the cache
        shares at that moment, or None when they differ: with one layout, a step checks
        its hits against what it needs once instead of once per hit."""
        found, layout, _, _ = self.lookup_all(keys, rows, modalities)
        return found, layout

    def lookup_all(self, keys: Sequence[int], rows: Sequence[int], modalities: Sequence[str | None] | None = None,
                   ) -> tuple[list[Any], tuple | None, bool, list[int] | None]:
        """``lookup_many``, whether every key was found (the planner then marks every source
        a hit without reading the list again) and, when every one was, the address of each
        entry's first row (else None): a step of hits copies them without reading a tensor."""
        with self._lock:
            entries = self._entries
            if not entries:  # nothing cached (a fresh cache): every key a miss
                self._misses += len(keys)
                return [None] * len(keys), None, not keys, [] if not keys else None
            steady = self._steady_hits(keys, rows, modalities) if not self._provisional else None
            if steady is not None:
                deque(map(entries.move_to_end, keys), maxlen=0)
                tensors, addresses = steady
                self._hits += len(tensors)
                return tensors, self._layout(), True, addresses
            found = list(map(entries.get, keys))
            if found == [None] * len(found):  # nothing cached (a cold step): no entry to check
                self._misses += len(found)
                return found, self._layout(), not found, [] if not found else None
            out, addresses = [], []
            append = out.append
            hits = 0
            move = entries.move_to_end
            provisional = self._provisional
            wanted = repeat(None) if modalities is None else modalities
            for key, n, modality in zip(keys, rows, wanted):
                entry = entries.get(key)
                if entry is None or (provisional and entry[_MODALITY] in provisional):
                    # Entries of a layout change not yet confirmed are not served:
                    # the step encodes them again, which confirms the change or undoes it.
                    append(None)
                elif modality is not None and entry[_MODALITY] is not None and entry[_MODALITY] != modality:
                    log.warning(
                        "Not serving cached multimodal embedding: key %d is cached as a %s embedding and asked for"
                        " as a %s one (one hash for two items of different modalities); it is encoded again"
                        " and replaces the entry", key, entry[_MODALITY], modality,
                    )
                    append(None)
                elif entry[_ROWS] == n:
                    move(key)
                    append(entry[_TENSOR])
                    addresses.append(entry[_ADDRESS])
                    hits += 1
                else:
                    log.warning(
                        "Discarding cached multimodal embedding: key %d, expected %d rows, cached %d",
                        key, n, entry[_ROWS],
                    )
                    self._pop(key)
                    self._discarded += 1
                    append(None)
            self._hits += hits
            self._misses += len(out) - hits
            every = hits == len(out)
            return out, self._layout(), every, addresses if every else None

    def _steady_hits(self, keys: Sequence[int], rows: Sequence[int],
                     modalities: Sequence[str | None] | None = None) -> tuple[list, list] | None:
        """The tensors of ``keys`` and their addresses when every key is cached with the
        expected rows (and a modality that may serve it), the steady state; else None.
        Changes nothing (the caller's loop handles the rest)."""
        entries = self._entries
        if _all_hits is not None and type(keys) is list and type(rows) is list and (
                modalities is None or type(modalities) is list):
            return _all_hits(entries, keys, rows, modalities, _TENSOR, _ROWS, _MODALITY, _ADDRESS)
        # Each pass runs in C; a key not cached (None) stops the row count pass.
        found = list(map(entries.get, keys))
        try:
            counts = list(map(_row_count, found))
        except TypeError:
            return None
        if counts != (rows if type(rows) is list else list(rows)):
            return None
        if modalities is not None and not all(map(_may_serve, map(_modality_of, found), modalities)):
            return None
        return list(map(_tensor_of, found)), list(map(_address_of_entry, found))

    def _layout(self) -> tuple | None:
        return next(iter(self._layouts)) if len(self._layouts) == 1 else None

    def layout_of(self, modality: str, *, declared_only: bool = False,
                  confirmed_only: bool = False) -> tuple[int | None, Any]:
        """``(hidden, dtype)`` the entries of ``modality`` must have, each None where
        neither declared nor (unless ``declared_only``) learned from the entries held;
        ``confirmed_only``: a learned layout only once confirmed (``layout_confirmed``)."""
        with self._lock:
            return self._layout_of(modality, declared_only, confirmed_only)

    def step_layouts(self, modalities: Iterable[str], proven_hidden: int | None = None) -> tuple:
        """What a step encoding outputs of ``modalities`` is held to, read under one lock:
        ``(binding, weak, sources, disputes)``: per modality the layout that binds (declared,
        or learned and confirmed; only the declared one while a change is unconfirmed, or when
        ``proven_hidden``, the step's proven hidden size, differs from the learned one), the
        learned layout nothing confirmed yet where it differs, where each comes from in words,
        and the layouts earlier outputs disputed the weak ones with (see ``scheduler.learn_cache_layouts``)."""
        binding, weak, sources, disputes = {}, {}, {}, frozenset()
        with self._lock:
            for modality in modalities:
                layout = self._layout_of(modality)
                if (proven_hidden is not None and layout[0] is not None and layout[0] != proven_hidden) \
                        or modality in self._provisional:
                    layout = bound = self._layout_of(modality, declared_only=True)
                else:
                    bound = self._layout_of(modality, confirmed_only=True)
                if bound != (None, None):
                    binding[modality] = bound
                if layout != bound:
                    weak[modality] = layout
                    disputes |= self._disputes.get(modality, frozenset())
                if layout != (None, None):
                    sources[modality] = self._layout_source(modality)
        return binding, weak, sources, disputes

    def layout_confirmed(self, modality: str) -> bool:
        """True when ``modality``'s learned layout binds: three inserts (steps) brought it
        (``_CONFIRMING_INSERTS``) or a step merged into ``input_embeds`` proved its hidden
        size. Until then a step is not held to it, and an output that disagrees replaces it
        (its entries evicted, the log says so) instead of being refused: one unverified
        output (a warm-up's, a faulty call's) never decides the layout for good."""
        with self._lock:
            held = self._held.get(modality)
            return bool(held) and len(held) == 1 and self._confirmed(modality, next(iter(held)))

    def note_dispute(self, modalities: Iterable[str], layout: tuple) -> None:
        """A step was refused because its outputs, of ``layout`` ``(hidden, dtype)``, disagree
        with its own hits of an unconfirmed learned layout of one of ``modalities``: nothing
        was evicted. Recorded, so that the next step bringing ``layout`` against those
        layouts wins (its hits are evicted and encoded again) instead of failing as well."""
        with self._lock:
            for modality in modalities:
                self._dispute(modality, layout)

    def _dispute(self, modality: str, layout: tuple) -> None:
        self._disputes[modality] = self._disputes.get(modality, frozenset()) | {tuple(layout)}

    def disputes(self, modality: str) -> frozenset:
        """The layouts ``note_dispute`` recorded against ``modality``'s learned layout."""
        with self._lock:
            return self._disputes.get(modality, frozenset())

    def layout_changing(self, modality: str) -> bool:
        """True while ``modality``'s learned layout is a change fewer than three inserts
        brought (``_CONFIRMING_INSERTS``): a step then holds its outputs to the declared layout only,
        and the cache keeps whichever of the two layouts they have (see ``_count_held``)."""
        with self._lock:
            return modality in self._provisional

    def layout_source(self, modality: str) -> str:
        """Where ``layout_of(modality)`` comes from, in words (for error messages)."""
        with self._lock:
            return self._layout_source(modality)

    def insert_many(self, entries: Iterable[tuple[int, Any]], *, protect: Iterable[int] = (),
                    modalities: Sequence[str | None] | None = None, replace_learned: bool = False,
                    vouched: tuple | None = None, rows: Sequence[int] | None = None) -> int:
        """Insert ``(key, tensor)`` pairs under one lock; returns how many were cached.
        ``protect``: keys that must not be evicted to make room (the inserting step's
        own hits). ``modalities``: each tensor's modality; a tensor disagreeing with its
        modality's layout (see ``layout_of``, or an earlier tensor of the batch) raises
        ``CacheLayoutError`` before anything is inserted or evicted. ``replace_learned``:
        the tensors' hidden size is proven (see the module docstring); held entries of a
        learned layout of another hidden size are evicted instead, and the log says so.
        The caller has validated the tensors (floating, right rows). ``vouched``: the
        ``(hidden, dtype, device)`` every tensor is known to have, 2-D with ``rows[i]``
        rows, detached, contiguous and not a negated view (a step's validated outputs):
        then only their storages are read, not each tensor's layout."""
        pairs = list(entries)
        mods = [None] * len(pairs) if modalities is None else list(modalities)
        keys = list(map(_first, pairs))
        if vouched is not None and rows is not None and len(rows) == len(pairs):
            prepared, storages = self._vouched_entries(list(map(_second, pairs)), rows, mods, vouched)
        else:
            share = self.share_storage
            prepared, storages = [_entry(tensor, None, modality, share=share)
                                  for (_, tensor), modality in zip(pairs, mods)], None
        return self._insert_entries(keys, prepared, storages, mods, vouched, protect=protect,
                                    check=modalities is not None, replace_learned=replace_learned)

    def insert_outputs(self, keys: list, tensors: list, rows: list, modalities: list, layout: tuple,
                       storages: Sequence, *, protect: Iterable[int] = (), replace_learned: bool = False) -> int:
        """``insert_many`` of a step's validated encoder outputs that nothing needs to read
        again: ``tensors[i]`` (under ``keys[i]``, of ``modalities[i]``) is 2-D with ``rows[i]``
        rows of ``layout`` ``(hidden, dtype, device)``, detached, contiguous, not a negated
        view and alone in its storage, whose ``storage_id`` is ``storages[i]`` (on ``meta``
        none are listed)."""
        hidden, dtype, device = layout
        own = list(map((hidden * dtype.itemsize).__mul__, rows))
        if device.type == "meta":
            storages, addresses = (), repeat(0)
        elif len(storages) != len(keys):
            raise CacheStateError(f"insert_outputs: {len(storages)} storages for {len(keys)} tensors")
        else:
            storages = list(storages)
            addresses = map(_second, storages)  # alone in its storage: the storage's address
        entries = list(map(tuple, zip(tensors, rows, own, repeat(None), repeat(layout), modalities, addresses)))
        return self._insert_entries(keys, entries, storages, modalities, layout, protect=protect, check=True,
                                    replace_learned=replace_learned, total=sum(own))

    def _insert_entries(self, keys: list, entries: list, storages: list | None, mods: list, layout: tuple | None,
                        *, protect: Iterable[int], check: bool, replace_learned: bool, total: int | None = None) -> int:
        """The locked part of ``insert_many``: ``entries[i]`` under ``keys[i]``; ``storages``:
        the storage ids of entries of one ``layout`` (None: entries accounted one by one)."""
        share = self.share_storage
        with self._lock:
            if not self._grouped:
                self._inserts += 1
            held_back = self._check_layouts(
                list(zip(keys, entries)) if storages is None else _first_of_each(keys, entries, mods),
                replace_learned) if check else ()
            if held_back:
                kept = [i for i, modality in enumerate(mods) if modality not in held_back]
                keys, entries, mods = [keys[i] for i in kept], [entries[i] for i in kept], [mods[i] for i in kept]
                storages = [storages[i] for i in kept] if storages else storages
                total = None
                if not entries:
                    return 0
            if (self._by_storage or self._reused) and not share and (
                    storages is None or not self._reused.keys().isdisjoint(storages)
                    or not self._by_storage.keys().isdisjoint(storages)):
                entries, storages, total = self._unshare(keys, entries), None, None
            if total is None:
                total = sum(map(_charged, entries))
            held = self._entries
            if self._bytes + total <= self.max_bytes and held.keys().isdisjoint(keys) \
                    and len(dict.fromkeys(keys)) == len(keys):
                # New keys that fit without evicting (a step's encoder outputs, usually):
                # all added at once, in order, exactly as one at a time would add them.
                # Item by item from C: OrderedDict.update of a dict is about three times slower.
                deque(map(held.__setitem__, keys, entries), maxlen=0)
                if storages is None:
                    for key, entry in zip(keys, entries):
                        self._account(key, entry, 1)
                else:
                    self._account_vouched(keys, storages, mods, layout)
                self._bytes += total
                self._insertions += len(keys)
                return len(keys)
            keep = set(protect)
            inserted = 0
            for key, entry in zip(keys, entries):
                inserted += self._insert(key, entry, keep)
        return inserted

    def _vouched_entries(self, tensors: list, rows: Sequence[int], mods: list,
                         vouched: tuple) -> tuple[list, list | None]:
        """``insert_many``'s entries for tensors of one known layout: each tensor's storage
        size read (a view of a larger storage is cloned, as ``_entry`` does), nothing else.
        Also returns the storage ids ``_account`` would record (None when a tensor was
        cloned: those entries are then accounted one by one)."""
        hidden, dtype, device = layout = vouched
        row_bytes = hidden * dtype.itemsize
        own = [n * row_bytes for n in rows]
        held = list(map(_storage_of, tensors))
        meta = device.type == "meta"
        if self.share_storage:
            charged = own  # kept as given, charged for its own rows
            addresses = repeat(0) if meta else map(_data_ptr, tensors)  # views start inside their storage
        else:
            charged = list(map(_storage_bytes, held))
            if charged != own:
                # Views of a larger storage: copied, as _entry copies them.
                entries = [(t, n, size, None, layout, m, _address_of(t)) if size == mine else _entry(t, None, m)
                           for t, n, size, mine, m in zip(tensors, rows, charged, own, mods)]
                return entries, None
            addresses = None  # each alone in its storage: its address is the storage's
        pointers = () if meta else list(map(_data_ptr, held))
        storages = () if meta else list(zip(repeat(device), pointers))
        if addresses is None:
            addresses = repeat(0) if meta else pointers
        entries = list(map(tuple, zip(tensors, rows, charged, repeat(None), repeat(layout), mods, addresses)))
        return entries, storages

    def _account_vouched(self, keys: list, storages: Sequence, mods: list, layout: tuple) -> None:
        """``_account(key, entry, 1)`` for every entry of ``_vouched_entries``, counted per
        modality instead of per entry."""
        self._layouts[layout] += len(keys)
        first = mods[0] if mods else None
        counts = {first: len(mods)} if mods.count(first) == len(mods) else Counter(mods)
        for modality, count in counts.items():
            if modality is not None:
                self._count_held(modality, layout[:2], count)
        self._by_storage.update(zip(storages, keys))

    def _layout_of(self, modality: str | None, declared_only: bool = False,
                   confirmed_only: bool = False) -> tuple[int | None, Any]:
        hidden = self._hidden_sizes.get(modality, self._hidden_sizes.get(None))
        dtype = self._dtypes.get(modality, self._dtypes.get(None))
        held = None if declared_only else self._held.get(modality)
        if held and len(held) == 1:
            learned = next(iter(held))
            if not confirmed_only or self._confirmed(modality, learned):
                hidden = learned[0] if hidden is None else hidden
                dtype = learned[1] if dtype is None else dtype
        return hidden, dtype

    def _confirmed(self, modality: str, layout: tuple) -> bool:
        return self._brought.get(modality, {}).get(layout, (0, 0))[0] >= _CONFIRMING_INSERTS

    def _replaceable(self, modality: str) -> bool:
        """The held entries of ``modality`` share one learned layout nothing confirmed yet,
        and no layout change is pending (its own rules apply then)."""
        held = self._held.get(modality)
        return bool(held) and len(held) == 1 and modality not in self._provisional \
            and not self._confirmed(modality, next(iter(held)))

    def _agrees(self, prepared: list[tuple[int, tuple]]) -> bool:
        """Every entry has the layout its modality's held entries have, or, for a modality
        nothing is held, declared or remembered of, the layout of the batch's other entries
        of it: the usual insert, which ``_check_layouts`` would pass changing nothing."""
        fresh: dict[str, tuple] = {}
        for _, entry in prepared:
            modality = entry[_MODALITY]
            if modality is None:
                continue
            layout = entry[_LAYOUT][:2]
            held = self._held.get(modality)
            if held is not None:
                if len(held) != 1 or layout not in held:
                    return False
            elif fresh.setdefault(modality, layout) != layout or modality in self._forgotten \
                    or self._layout_of(modality, declared_only=True) != (None, None):
                return False
        return True

    def _check_layouts(self, prepared: list[tuple[int, tuple]], replace_learned: bool) -> set[str]:
        """Every entry against its modality's layout (``CacheLayoutError`` for the first that
        disagrees), applying what the batch decides: a proven size replaces a learned one, a
        layout change is undone, an unconfirmed learned layout is disputed or replaced (see
        ``layout_confirmed``). Returns the modalities whose entries are held back (not cached):
        those whose outputs dispute such a layout for the first time."""
        if not replace_learned and not self._provisional and self._agrees(prepared):
            return set()
        batch: dict[str, tuple[int, Any]] = {}
        replace: dict[str, tuple[int, Any]] = {}
        unconfirmed: dict[str, tuple[int, Any]] = {}  # learned layouts nothing confirmed, replaced
        seen: dict[str, set] = {}
        for _, entry in prepared:
            if entry[_MODALITY] is not None:
                seen.setdefault(entry[_MODALITY], set()).add(entry[_LAYOUT][:2])
        if replace_learned:
            for modality, layouts in seen.items():
                self._settle_proven(modality, layouts)
        undo = []
        for modality, layouts in seen.items():
            change = self._provisional.get(modality)
            if change is not None and change[0] in layouts:
                # Outputs of the layout an unconfirmed change replaced: that change came from
                # fewer inserts, these agree with every insert before it, so they win.
                batch[modality] = change[0]
                undo.append(modality)
                continue
            # A batch at odds with itself while no entry of its modality is held: the
            # layout last learned (if it is one of the batch's) names the odd tensor out.
            previous = self._forgotten.get(modality)
            if len(layouts) > 1 and modality not in self._held and previous in layouts:
                batch[modality] = previous
        for key, entry in prepared:
            modality = entry[_MODALITY]
            if modality is None:
                continue
            hidden, dtype = entry[_LAYOUT][:2]
            first = batch.get(modality)
            want_hidden, want_dtype = first or self._layout_of(modality)
            if (want_hidden is not None and hidden != want_hidden) or (want_dtype is not None and dtype != want_dtype):
                declared_hidden, declared_dtype = self._layout_of(modality, declared_only=True)
                if replace_learned and first is None and declared_hidden is None and hidden != want_hidden \
                        and (declared_dtype is None or dtype == declared_dtype):
                    replace[modality] = (hidden, dtype)
                elif first is None and len(seen[modality]) == 1 and self._replaceable(modality) \
                        and declared_hidden in (None, hidden) and declared_dtype in (None, dtype):
                    # A batch at odds with itself is refused instead: the held layout names the odd one.
                    unconfirmed[modality] = (hidden, dtype)
                else:
                    source = self._layout_source(modality) if first is None else (
                        "an earlier tensor of this batch" if first != self._forgotten.get(modality) else
                        f"the {modality} layout learned last, which other tensors of this batch share")
                    raise CacheLayoutError(
                        f"key {key}: a {modality} embedding of hidden size {hidden} and dtype {dtype}, but"
                        f" {modality} embeddings must have hidden size {want_hidden} and dtype {want_dtype}"
                        f" ({source}); nothing of this step was cached",
                        key=key, modality=modality, got=(hidden, dtype), expected=(want_hidden, want_dtype),
                    )
            batch.setdefault(modality, (hidden, dtype))
        for modality, layout in replace.items():
            self._replace_learned(modality, layout)
        held_back = set()
        for modality, layout in unconfirmed.items():
            if layout in self._disputes.get(modality, ()):
                self._replace_unconfirmed(modality, layout)
            else:
                held_back.add(modality)
                self._hold_back(modality, layout)
        for modality in undo:
            self._undo_change(modality)
        return held_back

    def _settle_proven(self, modality: str, layouts: set) -> None:
        """A step whose hidden size ``input_embeds`` proves settles what no count of inserts
        should decide for it: a learned layout of another hidden size, forgotten with its last
        entry (a merge step evicts its own unfit hits first), is not brought back by this
        step's inserts as a change to confirm; an unconfirmed change to the proven hidden size
        (the dtype kept) is confirmed. Later faulty outputs then cannot undo the proof."""
        hidden = {layout[0] for layout in layouts}
        if len(hidden) != 1 or modality in self._hidden_sizes or None in self._hidden_sizes:
            return
        (proven,) = hidden
        brought = self._brought.setdefault(modality, {})
        for layout in layouts:
            count, last = brought.get(layout, (0, -1))
            brought[layout] = (max(count, _CONFIRMING_INSERTS), last)
        previous = self._forgotten.get(modality)
        if modality not in self._held and previous is not None and previous[0] != proven:
            del self._forgotten[modality]
            self._provisional.pop(modality, None)
            log.warning(
                "%s embeddings now have hidden size %d (outputs of a step merged into input_embeds of that size);"
                " the layout learned before (hidden size %d, dtype %s), held by no entry, was never declared and"
                " is forgotten", modality, proven, previous[0], previous[1],
            )
            return
        change = self._provisional.get(modality)
        if change is not None and change[1][0] == proven != change[0][0] and change[1][1] == change[0][1]:
            del self._provisional[modality]
            log.info("%s embeddings: hidden size %d confirmed by a step merged into input_embeds of that size",
                     modality, proven)

    def _undo_change(self, modality: str) -> None:
        """Evict the entries of an unconfirmed layout change of ``modality``; the layout it
        replaced is learned again from the entries being inserted (no change to log then)."""
        old, new, _, _ = self._provisional[modality]
        evicted = self._evict_modality(modality)
        log.warning(
            "%s embeddings are back to hidden size %d and dtype %s: the change to hidden size %d and dtype %s,"
            " not yet confirmed by later inserts, was undone by outputs of the earlier layout; its %d"
            " cached %s entries were evicted", modality, old[0], old[1], new[0], new[1], evicted, modality,
        )

    def _evict_modality(self, modality: str, keep_hidden: int | None = None, forget: bool = True) -> int:
        """Discard every held ``modality`` entry (of another hidden size than ``keep_hidden``,
        when given) and, with ``forget``, what was learned from them (else the layout stays
        the one last learned, as when its last entry goes); returns how many went."""
        stale = [key for key, entry in self._entries.items()
                 if entry[_MODALITY] == modality and entry[_LAYOUT][0] != keep_hidden]
        for key in stale:
            self._pop(key)
            self._discarded += 1
        if forget:
            self._forgotten.pop(modality, None)
            self._provisional.pop(modality, None)
        self._disputes.pop(modality, None)
        return len(stale)

    def _hold_back(self, modality: str, layout: tuple) -> None:
        """Outputs of ``layout`` met a learned layout of ``modality`` that nothing confirmed,
        for the first time: either may be the faulty one, so the outputs are not refused (their
        step runs) but not cached either, and the held entries stay; the next outputs of
        ``layout`` against it replace it (``_replace_unconfirmed``)."""
        old = next(iter(self._held[modality]))
        inserts = self._brought.get(modality, {}).get(old, (0, 0))[0]
        self._dispute(modality, layout)
        log.warning(
            "%s embeddings of hidden size %d and dtype %s disagree with the layout learned from %d insert(s) (hidden"
            " size %d, dtype %s), which %d inserts or a step merged into input_embeds would have confirmed: they are"
            " not cached and nothing is evicted; the next outputs of that layout replace it",
            modality, layout[0], layout[1], inserts, old[0], old[1], _CONFIRMING_INSERTS,
        )

    def _replace_unconfirmed(self, modality: str, layout: tuple) -> None:
        """Outputs of ``layout`` met a learned layout of ``modality`` that nothing confirmed,
        which earlier outputs of ``layout`` disputed already: its entries are evicted and the
        outputs then change the learned layout like any outputs after its last entry went:
        provisionally, until later inserts confirm the change or undo it."""
        old = next(iter(self._held[modality]))
        inserts = self._brought.get(modality, {}).get(old, (0, 0))[0]
        evicted = self._evict_modality(modality, forget=False)
        log.warning(
            "%s embeddings of hidden size %d and dtype %s disagree with the layout learned from %d insert(s) (hidden"
            " size %d, dtype %s), which %d inserts or a step merged into input_embeds would have confirmed, and which"
            " earlier outputs of that layout disputed too: its %d cached %s entries were evicted",
            modality, layout[0], layout[1], inserts, old[0], old[1], _CONFIRMING_INSERTS, evicted, modality,
        )

    def _replace_learned(self, modality: str, layout: tuple) -> None:
        """Evict every held ``modality`` entry of another hidden size than ``layout``'s."""
        old = self._layout_of(modality)
        evicted = self._evict_modality(modality, keep_hidden=layout[0])
        log.warning(
            "%s embeddings now have hidden size %d and dtype %s (outputs of a step merged into input_embeds of"
            " that size); the %d cached %s entries of hidden size %s and dtype %s, a layout learned from them and"
            " never declared, were evicted", modality, layout[0], layout[1], evicted, modality, old[0], old[1],
        )

    def _layout_source(self, modality: str) -> str:
        hidden = modality in self._hidden_sizes or None in self._hidden_sizes
        dtype = modality in self._dtypes or None in self._dtypes
        held = sum(self._held.get(modality, {}).values())
        learned = f"learned from the {held} {modality} {'entry' if held == 1 else 'entries'} the cache holds"
        layouts = self._held.get(modality)
        if layouts and len(layouts) == 1:
            inserts = self._brought.get(modality, {}).get(next(iter(layouts)), (0, 0))[0]
            learned += (", confirmed" if inserts >= _CONFIRMING_INSERTS else ", not yet confirmed") + \
                f" ({inserts} insert{'' if inserts == 1 else 's'} brought it)"
        if hidden and dtype:
            return f"declared for {modality}"
        if hidden or dtype:
            declared, other = ("hidden size", "dtype") if hidden else ("dtype", "hidden size")
            return f"{declared} declared for {modality}, {other} " + (learned if held else "not yet known")
        return learned if held else f"no {modality} layout declared or held"

    def _unshare(self, keys: list, entries: list) -> list[tuple]:
        """Entries whose tensor would be cached by reference in a storage another entry
        already holds (an encoder reusing its output buffer) copied; the entry holding
        it was overwritten by the encoder's later call and is evicted."""
        out = []
        for key, entry in zip(keys, entries):
            storage = storage_id(entry[_TENSOR])
            holder = self._by_storage.get(storage) if storage is not None else None
            if storage is not None and (storage in self._reused or (holder is not None and holder != key)):
                if holder is not None and holder != key:
                    self._note_reuse(storage, holder, key)
                copy = entry[_TENSOR].clone()
                entry = (copy, *entry[1:_ADDRESS], _address_of(copy))
            out.append(entry)
        return out

    def _note_reuse(self, storage: tuple, holder: int, key: int | None = None) -> None:
        """``holder``'s memory was written by a later encoder output (for ``key``, when known):
        evicted, and outputs in that storage are copied before caching from now on."""
        self._reused[storage] = None
        if len(self._reused) > _REUSED_STORAGES_KEPT:
            self._reused.popitem(last=False)
        if self._pop(holder):
            self._discarded += 1
        if not self._warned_reuse:
            self._warned_reuse = True
            by = "An encoder output" if key is None else f"An encoder output for key {key}"
            log.warning(
                "%s shares its storage with the cached entry for key %d (the encoder reuses one output buffer,"
                " which overwrote that entry): the entry was evicted, and outputs in that buffer are copied before"
                " caching from now on; Encoder(fn, copy_outputs=True) copies every output up front", by, holder,
            )

    def discard(self, key: int) -> bool:
        """Drop an entry found to be wrong (e.g. one that failed assembly)."""
        with self._lock:
            if self._pop(key):
                self._discarded += 1
                return True
            return False

    def discard_many(self, keys: Iterable[int]) -> None:
        """``discard`` for every key, under one lock."""
        with self._lock:
            for key in keys:
                if self._pop(key):
                    self._discarded += 1

    def discard_storages(self, storages: Iterable[tuple]) -> int:
        """Drop the entries holding any of ``storages`` (``storage_id`` values): memory a
        step's encoder wrote its outputs into, so what those entries cached by reference is
        gone, whether or not the step got as far as inserting (where ``insert_many`` would
        notice). Returns how many went; the log says so."""
        with self._lock:
            held = [(s, self._by_storage[s]) for s in set(storages) if s in self._by_storage]
            for storage, holder in held:
                self._note_reuse(storage, holder)
        return len(held)

    # -- single-key API -------------------------------------------------------------------
    def lookup(self, key: int) -> Any | None:
        """The 2-D tensor cached under ``key`` (refreshing its recency), or None. Counts a hit
        or miss. An entry of a layout change not yet confirmed is not served (None)."""
        with self._lock:
            entry = self._served(key)
            return None if entry is None else entry[_TENSOR]

    def _served(self, key: int) -> tuple | None:
        """``key``'s entry for a single-key read (caller holds the lock), counted as a hit or a
        miss: None when absent or of an unconfirmed layout change, as ``lookup_all`` rules."""
        entry = self._entries.get(key)
        if entry is None or (self._provisional and entry[_MODALITY] in self._provisional):
            self._misses += 1
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return entry

    def insert(self, key: int, value: Any, *, modality: Any = None) -> bool:
        """Cache ``value`` (a tensor, an object with ``.embedding``, or either wrapped in
        ``ForModality``). Returns False when it cannot fit without evicting pinned entries
        or exceeds the whole budget. With a ``modality`` (here or from ``ForModality``) the
        tensor must agree with that modality's layout (``CacheLayoutError``, nothing
        inserted or evicted). An object with ``.embedding`` is kept rebuilt around the
        entry's own tensor, which is what ``get_single`` serves. A tensor in the storage of
        another entry is taken for an encoder reusing its buffer, as ``insert_many`` does."""
        if isinstance(value, ForModality):
            value, modality = value.value, (value.modality if modality is None else modality)
        tensor = _unwrap(value)
        if not hasattr(tensor, "untyped_storage"):
            raise CacheStateError(
                f"key {key}: the cache stores tensors (or objects with a tensor .embedding), got {type(value).__name__}"
            )
        if tensor.dim() == 0:
            raise CacheStateError(f"key {key}: an embedding has rows and a hidden size ([rows, hidden]), got a 0-d tensor")
        if modality is not None:
            modality = modality_name(modality)
            if not tensor.dtype.is_floating_point or tensor.dim() < 2:
                # It would become the modality's learned layout and refuse every real output.
                raise CacheStateError(
                    f"key {key}: a {modality} embedding must be a floating [rows, hidden] tensor, got a"
                    f" {tensor.dim()}-d {tensor.dtype} one"
                )
        entry = _entry(tensor, None, modality, share=self.share_storage)
        # Rebuilt before the lock: a value that cannot be rebuilt is refused before
        # anything changes.
        kept = None if hasattr(value, "shape") else _kept_value(key, value, entry[_TENSOR])
        with self._lock:
            if not self._grouped:
                self._inserts += 1
            if modality is not None and self._check_layouts([(key, entry)], replace_learned=False):
                return False  # held back: it disputes a layout nothing confirmed (see _check_layouts)
            if not self.share_storage and (self._by_storage or self._reused):
                [unshared] = self._unshare([key], [entry])
                if kept is not None and unshared[_TENSOR] is not entry[_TENSOR]:
                    kept = _kept_value(key, kept, unshared[_TENSOR])  # around the copy
                entry = unshared
            if kept is not None:
                entry = (*entry[:_VALUE], kept, *entry[_VALUE + 1:])
            return self._insert(key, entry, ())

    @contextmanager
    def one_insert(self) -> Iterator[None]:
        """``insert``/``set`` calls inside the block count as one insert, the way a step's
        ``insert_many`` does: a changed layout is confirmed by inserts of several steps, and
        a step that caches its outputs one call at a time (EVS videos) must not confirm its
        own change. The cache's lock is held throughout."""
        with self._lock:
            if not self._grouped:
                self._inserts += 1
            self._grouped += 1
            try:
                yield
            finally:
                self._grouped -= 1

    def contains(self, key: int) -> bool:
        with self._lock:
            return key in self._entries

    @contextmanager
    def pin(self, keys: Iterable[int]) -> Iterator[None]:
        """Keep ``keys`` from being evicted while the block runs (any thread's inserts)."""
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
            self._layouts.clear()
            self._held.clear()
            self._forgotten.clear()
            self._provisional.clear()
            self._brought.clear()
            self._disputes.clear()
            self._by_storage.clear()
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
            entry = self._served(mm_hash)
        if entry is None:
            return None
        value = entry[_VALUE]
        return value if value is not None else EmbeddingResult(embedding=entry[_TENSOR])

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
    def _insert(self, key: int, entry: tuple, keep) -> bool:
        size = entry[_BYTES]
        old = self._entries.get(key)
        reclaim = old[_BYTES] if old is not None else 0
        if size > self.max_bytes or not self._make_room(size - reclaim, key, keep):
            self._rejected += 1
            return False
        if old is not None:
            self._bytes -= reclaim
            self._account(key, old, -1)
        self._entries[key] = entry
        self._account(key, entry, 1)
        self._entries.move_to_end(key)
        self._bytes += size
        self._insertions += 1
        return True

    def _pop(self, key: int) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._bytes -= entry[_BYTES]
        self._account(key, entry, -1)
        return True

    def _account(self, key: int, entry: tuple, sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) ``entry`` in the layout counts and storage map."""
        layout = entry[_LAYOUT]
        _count(self._layouts, layout, sign)
        modality = entry[_MODALITY]
        if modality is not None:
            self._count_held(modality, layout[:2], sign)
        storage = storage_id(entry[_TENSOR])
        if storage is not None:
            if sign > 0:
                self._by_storage[storage] = key
            elif self._by_storage.get(storage) == key:
                del self._by_storage[storage]

    def _count_held(self, modality: str, layout: tuple, sign: int) -> None:
        held = self._held.get(modality)
        if held is None:
            held = self._held[modality] = {}
            previous = self._forgotten.pop(modality, None)
            if previous is not None and previous != layout:
                change = self._provisional.get(modality)
                # Against the layout before an unconfirmed change, not the change itself.
                self._provisional[modality] = (change[0] if change else previous, layout, self._inserts, 1)
                log.warning(
                    "%s embeddings now have hidden size %d and dtype %s, learned from new entries; the layout"
                    " learned before (hidden size %d, dtype %s) was forgotten with the last entry that had it."
                    " Until %d more inserts bring that layout, its entries are not served",
                    modality, layout[0], layout[1], previous[0], previous[1], _CONFIRMING_INSERTS - 1,
                )
        if sign > 0:
            brought = self._brought.setdefault(modality, {})
            count, last = brought.get(layout, (0, -1))
            if last != self._inserts:
                # Another layout no entry holds counts no more: one that came and went (a change
                # undone, a layout replaced) never adds up to a confirmation over time.
                for other in [other for other in brought if other != layout and other not in held]:
                    del brought[other]
                brought[layout] = (count + 1, self._inserts)
                if count + 1 >= _CONFIRMING_INSERTS:
                    self._disputes.pop(modality, None)
            change = self._provisional.get(modality)
            if change is not None and change[1] == layout and change[2] != self._inserts:
                inserts = change[3] + 1
                if inserts < _CONFIRMING_INSERTS:
                    self._provisional[modality] = (change[0], layout, self._inserts, inserts)
                else:
                    del self._provisional[modality]
                    log.info("%s embeddings: hidden size %d and dtype %s confirmed by %d inserts",
                             modality, layout[0], layout[1], inserts)
        _count(held, layout, sign)
        if not held:
            del self._held[modality]
            self._forgotten[modality] = layout

    def _make_room(self, needed: int, key: int, keep) -> bool:
        """Evict unpinned LRU entries until ``needed`` more bytes fit. Decides first, so a
        request that cannot be satisfied evicts nothing."""
        excess = self._bytes + needed - self.max_bytes
        if excess <= 0:
            return True
        victims, freed = [], 0
        for other, entry in self._entries.items():
            if other == key or other in keep or self._pins[other] > 0:
                continue
            victims.append(other)
            freed += entry[_BYTES]
            if freed >= excess:
                break
        if freed < excess:
            return False
        for other in victims:
            self._pop(other)
            self._evictions += 1
        return True
