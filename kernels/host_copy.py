"""Row ranges copied between CPU tensors as plain byte copies.

Every torch call on the CPU pays a dispatch of about a microsecond before it moves a
byte, and a copy into a slice of another tensor pays it twice (the view, then the copy;
``_foreach_copy_`` loops over ``copy_`` on the CPU). A fused step writes one slice per
image into ``input_embeds``, so at a thousand images dispatch costs more than the copy
itself. Here each segment is one assignment between two ``memoryview`` slices, which
CPython turns into a single ``memcpy`` for contiguous bytes, at about a quarter of a
microsecond of overhead. Unlike torch's copies these hold the GIL while they run (about
a millisecond for the 16 MiB of a thousand-image step), which other Python threads of the
process wait through.

The views are built from raw addresses (``PyMemoryView_FromMemory``), two per call:
one over exactly ``dst``'s bytes, writable, and one read-only view over the address
range the sources span. Each segment is checked against its own source's bytes, every
destination slice against ``dst``'s view, and a destination slice and its source slice
must be the same length or the assignment raises: a wrong table fails loudly instead
of reading another tensor or writing past ``dst``. Both views are
released before returning, and the tensors they point into are held by the caller for
the whole call.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from itertools import repeat
from operator import add, attrgetter, le, mul, sub

import torch

try:
    from . import _stream_copy
except ImportError:  # installed without a C compiler: torch.cat makes these copies
    _stream_copy = None

# A destination this large outgrows a core's own caches and a thread's share of a shared
# one (glibc's memcpy turns to streaming stores at 3/4 of that share): it will be read
# back from memory anyway, so it is written with streaming stores, which skip reading
# every line before overwriting it. Smaller results stay on torch's ordinary stores.
STREAM_MIN_BYTES = 4 << 20

_PYBUF_READ, _PYBUF_WRITE = 0x100, 0x200
_dtype_of, _is_cpu, _nbytes_of = attrgetter("dtype"), attrgetter("is_cpu"), attrgetter("nbytes")


@functools.cache
def _view_from_memory():
    make = ctypes.pythonapi.PyMemoryView_FromMemory
    make.restype = ctypes.py_object
    make.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
    return make


def can_copy_bytes(sources: Sequence, dst) -> bool:
    """True when every source and ``dst`` are contiguous CPU tensors of one dtype, so
    that a row range is a byte range (no cast, no stride)."""
    if not dst.is_cpu or not dst.is_contiguous() or dst.is_neg() or dst.dim() != 2:
        return False
    return (set(map(_dtype_of, sources)) == {dst.dtype}
            and all(map(_is_cpu, sources))
            and all(map(torch.Tensor.is_contiguous, sources))
            and not any(map(torch.Tensor.is_neg, sources)))  # a negated view's bytes are not its values


def copy_row_ranges(sources: Sequence, source_of: Sequence[int], first_row: Sequence[int],
                    counts: Sequence[int], dst_rows: Sequence[int], dst, *, whole_sources: bool = False) -> None:
    """``dst[d : d + n] = sources[s][r : r + n]`` for every ``(s, r, n, d)`` of the four
    columns; ``can_copy_bytes(sources, dst)`` must hold and every source must have
    ``dst``'s row length. ``whole_sources``: segment ``i`` is all of ``sources[i]``."""
    row_bytes = repeat(dst.shape[1] * dst.element_size())
    addresses = [t.data_ptr() for t in sources]
    # An empty tensor may report address 0; it cannot be the start of the range read
    # (a segment naming it then fails the checks below, as it must: it has no rows).
    low = min((a for a in addresses if a), default=0)
    # Byte ranges, each column computed in one pass that runs in C.
    starts = list(map(sub, addresses, repeat(low)))
    ends = list(map(add, starts, map(_nbytes_of, sources)))
    if whole_sources:
        read_from, read_to = starts, ends  # exact: a count that disagrees fails the assignment
    else:
        read_from = list(map(add, map(starts.__getitem__, source_of), map(mul, first_row, row_bytes)))
        read_to = list(map(add, read_from, map(mul, counts, row_bytes)))
        if min(first_row) < 0 or not all(map(le, read_to, map(ends.__getitem__, source_of))):
            raise IndexError("a segment reads rows its source does not have")
    if min(dst_rows) < 0:
        raise IndexError("a segment writes before the first row of dst")
    write_from = list(map(mul, dst_rows, row_bytes))
    write_to = list(map(add, write_from, map(mul, counts, row_bytes)))
    make = _view_from_memory()
    into = make(dst.data_ptr(), dst.nbytes, _PYBUF_WRITE)
    read = make(low, max(ends), _PYBUF_READ)
    try:
        for a, b, c, d in zip(write_from, write_to, read_from, read_to):
            into[a:b] = read[c:d]
    finally:
        read.release()
        into.release()


def append_whole_sources(sources: list, rows: list, dst) -> bool:
    """``torch.cat(sources, out=dst)`` with streaming stores, when ``dst`` is a CPU tensor
    of at least ``STREAM_MIN_BYTES`` and the C helper is built; False, having written
    nothing, otherwise (the caller uses ``torch.cat``).

    Trusted, as ``trusted.copy_segments``: every source is a contiguous CPU tensor of
    ``dst``'s dtype and row length, not a negated view, with ``rows[i]`` rows, and the
    rows add up to ``dst``'s (the scheduler's validated sources are). Only the total
    is checked (``ValueError`` before anything is written)."""
    if _stream_copy is None or not dst.is_cpu or dst.nbytes < STREAM_MIN_BYTES or dst.dim() != 2:
        return False
    _stream_copy.append_rows(dst.data_ptr(), dst.nbytes, sources, rows, dst.shape[1] * dst.element_size())
    return True
