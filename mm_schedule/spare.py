"""A large packed result's memory, handed to the next step once nobody holds it.

A new CPU buffer above the C allocator's mmap threshold (glibc serves anything over
32 MiB with a fresh mapping) is faulted in page by page as it is written: for a
64 MiB result that costs more than assembling the rows. So the packed path keeps the
storage of its last large CPU result and gives it to the next step when it is
provably unused; a GPU caching allocator already does this for GPU results.

"Provably unused" is read from two reference counts, both exact at that moment:

* the storage's own use count (C++ owners: every tensor or view built on it, an
  autograd graph, a NumPy array or DLPack capsule of it) must be 1: the spare's own
  handle;
* the Python references to that handle must be only ours: torch hands out one Python
  object per storage, so a caller that kept ``result.untyped_storage()`` shares it.

Memory moved to shared memory (``share_memory_``) is never reused: another process may
still map it. Anything else (the caller still holds the result, a view of it, cached it) and the
step allocates afresh, exactly as without a spare. The handle is taken out of the slot
under a lock before it is checked, so two threads never get the same memory. One
spare is kept per process, at most the size of the largest recent result.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

MIN_BYTES = 1 << 22  # smaller buffers come from the allocator's free lists without faults
SLACK = 4  # a spare up to 1/SLACK larger than needed is used (then trimmed by the shape)

_lock = threading.Lock()
_spare: Any = None  # UntypedStorage of the last large CPU result


def _python_refs(storage: Any) -> int:
    return sys.getrefcount(storage)


def _python_refs_of_a_local() -> int:
    storage = torch.UntypedStorage(0)
    return _python_refs(storage)


# What ``_python_refs`` reports for a storage held by one local variable and nothing
# else (measured, not assumed: argument passing differs between Python versions).
_ONLY_OURS = _python_refs_of_a_local()
# C++ owners of a storage (a private torch function: without it, nothing is ever reused).
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def drop_spare() -> None:
    """Free the kept memory (e.g. before a phase without large steps)."""
    global _spare
    with _lock:
        _spare = None


def packed_buffer(rows: int, hidden: int, dtype: Any, device: Any) -> Any:
    """An uninitialised contiguous ``[rows, hidden]`` CPU tensor, on the spare's memory
    when it may be reused; None for a result too small to keep or not on the CPU (the
    caller allocates it as usual)."""
    global _spare
    nbytes = rows * hidden * dtype.itemsize
    if nbytes < MIN_BYTES or device.type != "cpu" or _use_count is None:
        return None
    with _lock:
        storage, _spare = _spare, None
    # Checked here, in the frame that holds ``storage`` in one local variable, as ``_ONLY_OURS`` was measured.
    if (storage is not None and _python_refs(storage) == _ONLY_OURS and _use_count(storage._cdata) == 1
            and not storage.is_shared() and nbytes <= storage.nbytes() <= nbytes + nbytes // SLACK):
        out = torch.empty(0, dtype=dtype).set_(storage, 0, (rows, hidden))
    else:
        storage = None  # dropped now: a result nobody holds is freed before the new one exists
        out = torch.empty((rows, hidden), dtype=dtype)
    with _lock:
        _spare = out.untyped_storage()
    return out
