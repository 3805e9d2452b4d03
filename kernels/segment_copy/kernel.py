"""The Triton kernel of the segment copy: program ``t`` finds the segment holding its
tile of at most ``BLOCK_M`` rows by a binary search of the table's cumulative tile counts
(``table.py``), or takes the one segment passed as launch arguments (``ONE_SEGMENT``),
and copies it ``BLOCK_H`` columns per step.

Loads through an address read from memory are scalar unless the cast pointer carries
``tl.multiple_of``; the host proves 16-byte alignment (every source, the destination,
and ``H * itemsize``) and then launches with ``VEC`` = elements per 16 bytes, passing the
row length in vectors so its divisibility is structural. Anything else runs ``VEC=1``:
correct, just narrower. Full tiles run unmasked but for the last step of a row length
that is no multiple of ``BLOCK_H``. Programs past the last tile copy nothing and read
no segment record, which makes an empty table with a fixed grid safe.
"""

from __future__ import annotations

from .._triton import HAS_TRITON, cast_to, tl, triton

if HAS_TRITON:

    @triton.jit
    def _copy_step(src_rows, dst_rows, h, rows_ok, hidden,
                   MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr, BLOCK_H: tl.constexpr):
        cols = (h + tl.arange(0, BLOCK_H))[None, :]
        if MASK_COLS:
            mask = rows_ok & (cols < hidden)
        else:
            mask = rows_ok
        if MASK_ROWS or MASK_COLS:
            x = tl.load(src_rows + cols, mask=mask)
            tl.store(dst_rows + cols, cast_to(x, dst_rows.dtype.element_ty), mask=mask)
        else:
            x = tl.load(src_rows + cols)
            tl.store(dst_rows + cols, cast_to(x, dst_rows.dtype.element_ty))

    @triton.jit
    def _copy_cols(src_rows, dst_rows, stop, rows_ok, hidden,
                   MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr, BLOCK_H: tl.constexpr):
        for h in range(0, stop, BLOCK_H):
            _copy_step(src_rows, dst_rows, h, rows_ok, hidden, MASK_ROWS, MASK_COLS, BLOCK_H)

    @triton.jit
    def _copy_tile(src_rows, dst_rows, hidden, n_rows, EVEN_H: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
        """Copy ``n_rows`` (at most ``BLOCK_M``) rows of ``hidden`` elements.

        On AMD a masked store waits for every load in flight before it, an unmasked one
        only for its own load; so a full tile copies its whole ``BLOCK_H`` steps without
        masks, and only the last step of a row length that is not a multiple of
        ``BLOCK_H`` (outside the loop) and the partial tiles are masked."""
        rows_ok = (tl.arange(0, BLOCK_M) < n_rows)[:, None]
        if n_rows == BLOCK_M:
            if EVEN_H:
                _copy_cols(src_rows, dst_rows, hidden, rows_ok, hidden, False, False, BLOCK_H)
            else:
                # Stated, not derived: Triton 3.6 loses the divisibility of `x - x % BLOCK`,
                # and the tail step's accesses would shrink to one element each.
                full = tl.multiple_of(hidden - hidden % BLOCK_H, BLOCK_H)
                _copy_cols(src_rows, dst_rows, full, rows_ok, hidden, False, False, BLOCK_H)
                if full < hidden:
                    _copy_step(src_rows, dst_rows, full, rows_ok, hidden, False, True, BLOCK_H)
        elif EVEN_H:
            _copy_cols(src_rows, dst_rows, hidden, rows_ok, hidden, True, False, BLOCK_H)
        else:
            _copy_cols(src_rows, dst_rows, hidden, rows_ok, hidden, True, True, BLOCK_H)

    @triton.jit
    def _find_segment(tile_ends, tile, n_segs):
        """The segment holding ``tile`` (``n_segs`` past the last tile) and the tile's rank in
        it: a binary search of the cumulative tile counts the packer wrote. Scalar loads and
        selects only, about ``log2(n_segs)`` of each, and no barrier."""
        lo = tile * 0
        hi = n_segs + lo
        while lo < hi:
            mid = (lo + hi) // 2
            past = tl.load(tile_ends + mid) <= tile
            lo = tl.where(past, mid + 1, lo)
            hi = tl.where(past, hi, mid)
        before = tl.load(tile_ends + lo - 1, mask=lo > 0, other=0)
        return lo, tile - before

    @triton.jit(do_not_specialize=["hidden_vecs", "seg_src", "seg_dst_row", "seg_rows"])
    def segment_copy_kernel(
        table_ptr,  # int64 table (table.py); None for ONE_SEGMENT launches
        dst_ptr,
        hidden_vecs,  # row length in units of VEC elements
        seg_src,  # ONE_SEGMENT: address of the segment's first source row
        seg_dst_row,  # ONE_SEGMENT: its first destination row
        seg_rows,  # ONE_SEGMENT: its row count
        SRC_DTYPE: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_H: tl.constexpr,
        VEC: tl.constexpr,
        EVEN_H: tl.constexpr,
        ONE_SEGMENT: tl.constexpr,
    ):
        tile = tl.program_id(0).to(tl.int64)
        # A product with a constexpr: the compiler knows `hidden` is a multiple of VEC for
        # every row length, which an integer argument only says when divisible by 16.
        hidden = hidden_vecs.to(tl.int64) * VEC
        if ONE_SEGMENT:
            first = tile * BLOCK_M
            src = seg_src.to(tl.pointer_type(SRC_DTYPE)) + first * hidden
            dst_row = seg_dst_row + first
            n_rows = tl.minimum(seg_rows - first, BLOCK_M)
        else:
            # [n_segs, tile ends (n_segs), records (4 words each), addresses]: table.py
            n_segs = tl.load(table_ptr)
            seg, rank = _find_segment(table_ptr + 1, tile, n_segs)
            first = rank * BLOCK_M
            # Programs past the last tile (every program of an empty table, which a plan
            # with a fixed grid launches) read no record: each load below is masked.
            live = seg < n_segs
            record = table_ptr + 1 + n_segs + seg * 4
            source = tl.load(record, mask=live, other=0)
            base = tl.load(table_ptr + 1 + n_segs * 5 + source, mask=live, other=0)
            src_row = tl.load(record + 1, mask=live, other=0)
            seg_n_rows = tl.load(record + 2, mask=live, other=0)
            src = base.to(tl.pointer_type(SRC_DTYPE)) + (src_row + first) * hidden
            dst_row = tl.load(record + 3, mask=live, other=0) + first
            n_rows = tl.where(live, tl.minimum(seg_n_rows - first, BLOCK_M), 0)
        if VEC > 1:
            # The host checked 16-byte aligned sources; the cast pointer cannot say so itself.
            src = tl.multiple_of(src, 16)
        rows = tl.arange(0, BLOCK_M)[:, None].to(tl.int64)
        src_rows = src + rows * hidden
        dst_rows = dst_ptr + (dst_row + rows) * hidden
        _copy_tile(src_rows, dst_rows, hidden, n_rows, EVEN_H, BLOCK_M, BLOCK_H)

else:
    segment_copy_kernel = None
