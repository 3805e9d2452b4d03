"""Cache keys: what an item's ``hash`` may be, and how a whole request is keyed.

Accepted item hashes:

* ``int`` (any size, negative too; NumPy integers and other ``__index__`` types count
  as ints). Used as is: the cache compares keys exactly, so distinct ints never share
  an entry.
* ``bytes`` / ``str``: turned into an int by an 8-byte BLAKE2b digest, which is the
  same in every process and on every rank (Python's own ``hash`` of str and bytes is
  salted per process and is never used).

Everything else is refused with ``InvalidItemError``: a ``float`` hash would be
truncated or rounded into another item's key, ``None`` means the item was never hashed,
and ``bool`` is almost certainly a bug.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Sequence
from typing import Any

from .errors import InvalidItemError

_PERSON = b"mm-schedule-key"


def item_key(value: Any, request: int) -> int:
    """The cache key for an item whose ``hash`` is ``value`` (request index for errors)."""
    if type(value) is int:
        return value
    if isinstance(value, (bytes, bytearray, str)):
        data = value.encode() if isinstance(value, str) else bytes(value)
        return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=_PERSON).digest(), "little")
    if value is None:
        raise InvalidItemError(f"request {request}: item has no hash; the scheduler keys the cache by it")
    if isinstance(value, bool) or isinstance(value, float):
        raise InvalidItemError(
            f"request {request}: item hash {value!r} is a {type(value).__name__}; use an int (or bytes/str)"
        )
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidItemError(
            f"request {request}: item hash {value!r} of type {type(value).__name__} is not an int, bytes or str"
        ) from None


def combine_hashes(hashes: Sequence[int]) -> int | None:
    """The whole-request key for a list of item keys (None for an empty list).

    Python's ``hash`` of a tuple of ints is the same in every process
    (``PYTHONHASHSEED`` salts only str and bytes), so every rank agrees on it; it is
    SGLang's choice too, which keeps its cache keys interchangeable with ours.
    """
    if not hashes:
        return None
    return hash(tuple(hashes))
