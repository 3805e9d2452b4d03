"""Row ranges copied between CPU tensors as plain byte copies.

Every torch call on the CPU pays a dispatch of about a microsecond before it moves a
byte, and a copy into a slice of another tensor pays it twice (the view, then the copy;
``_foreach_copy_`` loops over ``copy_`` on the CPU). A fused step writes one slice per
image into ``input_embeds``, so at a thousand images dispatch costs more than the copy
itself. Here the table becomes byte ranges, each column computed in one pass of C
builtins, and one call of the package's C helper (``_stream_copy.c``) copies them all,
with streaming stores when the destination is large (``STREAM_MIN_BYTES``). Without the
helper each range is one assignment between two ``memoryview`` slices, which CPython
turns into a single ``memcpy``, at about a quarter of a microsecond of overhead.

The ranges are relative to two raw addresses: ``dst``'s first byte, and the lowest first
byte of the sources (the sources are read as one span up to the end of the highest).
Each segment is checked against its own source's bytes here, and every range against
``dst`` and the span by the C helper before any byte moves (or by the ``memoryview``
views, built from raw addresses with ``PyMemoryView_FromMemory``, which refuse a slice
assignment whose lengths differ): a wrong table fails loudly instead of reading another
tensor or writing past ``dst``. The copies hold the GIL while they run (about a
millisecond for the 16 MiB of a thousand-image step), which other Python threads of the
process wait through; the tensors they point into are held by the caller for the whole
call.
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
    lengths = list(map(mul, counts, row_bytes))
    if whole_sources:
        read_from = starts
        if lengths != list(map(sub, ends, starts)):
            raise ValueError("a whole source's row count is not its number of rows")
    else:
        read_from = list(map(add, map(starts.__getitem__, source_of), map(mul, first_row, row_bytes)))
        if min(first_row) < 0 or not all(map(le, map(add, read_from, lengths), map(ends.__getitem__, source_of))):
            raise IndexError("a segment reads rows its source does not have")
    if min(dst_rows) < 0:
        raise IndexError("a segment writes before the first row of dst")
    write_from = list(map(mul, dst_rows, row_bytes))
    if _stream_copy is not None:
        # Every range is checked against dst and the sources' span before any byte moves.
        _stream_copy.copy_ranges(dst.data_ptr(), dst.nbytes, low, max(ends), write_from, read_from, lengths,
                                 dst.nbytes >= STREAM_MIN_BYTES)
        return
    make = _view_from_memory()
    into = make(dst.data_ptr(), dst.nbytes, _PYBUF_WRITE)
    read = make(low, max(ends), _PYBUF_READ)
    try:
        for a, c, n in zip(write_from, read_from, lengths):
            into[a : a + n] = read[c : c + n]
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
    if (_stream_copy is None or not dst.is_cpu or dst.nbytes < STREAM_MIN_BYTES or dst.dim() != 2
            or not dst.is_contiguous()):
        return False
    _stream_copy.append_rows(dst.data_ptr(), dst.nbytes, sources, rows, dst.shape[1] * dst.element_size())
    return True
