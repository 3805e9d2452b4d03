"""Segment gather: rows of many source tensors copied by one kernel launch.

A segment ``(source, src_row, n_rows, dst_row)`` copies
``sources[source][src_row : src_row + n_rows]`` to ``dest[dst_row : dst_row + n_rows]``.
The destination is either a packed ``[n_rows, H]`` buffer (``gather_segments``) or the
text ``input_embeds`` itself (``segment_merge.merge_segments``); both run the kernel below.

Equivalent PyTorch::

    for source, src_row, n_rows, dst_row in segments:
        dest[dst_row : dst_row + n_rows] = sources[source][src_row : src_row + n_rows].to(dest.dtype)

How the kernel gets its rows: the host cuts every segment into tiles of at most
``BLOCK_M`` rows (``table.py``) and stores, per tile, the raw address of its first source
row. One program copies one tile, ``BLOCK_H`` columns per step. Loads through an address
read from memory are scalar unless the cast pointer carries ``tl.multiple_of``; the host
proves 16-byte alignment (every source, the destination, and ``H * itemsize``) and then
picks the ``ALIGNED`` specialisation, which promises exactly that and gets 16-byte vector
loads and stores. Anything else runs the unhinted variant: correct, just narrower.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import KernelInputError
from ._triton import HAS_TRITON, cast_to, tl, tl_dtype, triton
from .backend import select_backend
from .dtypes import SUPPORTED_DTYPES, vector_width
from .launch_config import resolve_config, unaligned_config
from .segments import Segment, check_segments, check_tensors, total_rows
from .table import count_tiles, host_tiles, upload

KERNEL_NAME = "segment_gather"

if HAS_TRITON:

    @triton.jit
    def segment_copy_kernel(
        tiles_ptr,  # int64 [n_tiles, 3]: first source row address, first destination row, rows
        dst_ptr,
        hidden,
        SRC_DTYPE: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_H: tl.constexpr,
        ALIGNED: tl.constexpr,
        VEC: tl.constexpr,
    ):
        tile = tl.program_id(0).to(tl.int64) * 3
        src_addr = tl.load(tiles_ptr + tile)
        dst_row = tl.load(tiles_ptr + tile + 1)
        n_rows = tl.load(tiles_ptr + tile + 2)
        src = src_addr.to(tl.pointer_type(SRC_DTYPE))
        if ALIGNED:
            # Promises the host checked: 16-byte aligned rows whose length is a multiple of VEC.
            src = tl.multiple_of(src, 16)
            hidden = tl.multiple_of(hidden, VEC)
        rows = tl.arange(0, BLOCK_M)
        row_ok = (rows < n_rows)[:, None]
        src_rows = src + rows[:, None].to(tl.int64) * hidden
        dst_rows = dst_ptr + (dst_row + rows[:, None]) * hidden
        for h in range(0, hidden, BLOCK_H):
            cols = h + tl.arange(0, BLOCK_H)
            mask = row_ok & (cols < hidden)[None, :]
            x = tl.load(src_rows + cols[None, :], mask=mask)
            tl.store(dst_rows + cols[None, :], cast_to(x, dst_ptr.dtype.element_ty), mask=mask)


def gather_segments_ref(sources: Sequence, segments: Sequence[Segment], out) -> None:
    """Plain-torch reference and CPU fallback: one ``copy_`` per segment (casts like ``.to``)."""
    for source, src_row, n_rows, dst_row in segments:
        out[dst_row : dst_row + n_rows].copy_(sources[source][src_row : src_row + n_rows])


def is_aligned(sources: Sequence, dest) -> bool:
    """True when 16-byte vector access is valid for every row of every source and of ``dest``."""
    itemsizes = [dest.element_size()] + [s.element_size() for s in sources[:1]]
    if dest.shape[1] % vector_width(*itemsizes):
        return False
    return all(t.data_ptr() % 16 == 0 for t in (dest, *sources))


def _check_triton_dtypes(sources: Sequence, dest) -> None:
    for what, dtype in [("destination", dest.dtype)] + [
        (f"source {i}", s.dtype) for i, s in enumerate(sources)
    ]:
        if str(dtype).removeprefix("torch.") not in SUPPORTED_DTYPES:
            raise KernelInputError(
                f"{what} has dtype {dtype}; the Triton kernel supports bfloat16, float16 and float32"
                " (set MM_SCHEDULE_KERNEL_BACKEND=torch for other dtypes)"
            )


class SegmentPlan:
    """A checked segment table, ready to run (FlashInfer-style plan/run split).

    ``plan_segments`` does all host work once: checks the table against the sources and
    the destination, picks the backend, the config and the aligned or unaligned variant,
    and uploads the tile table (pinned memory, ``non_blocking`` copy). ``run_segments``
    then only launches: no allocation, no host sync.

    For CUDA-graph capture of ``run_segments``: plan with ``capacity`` (tiles) so the grid
    is fixed, and between replays keep fixed the destination tensor (same storage, dtype,
    shape), the source dtype and hidden size, and the alignment class; the sources may
    change only through ``update``, which rewrites the same device table in place (new
    source tensors must stay alive, and at fixed addresses, while the graph is replayed).
    """

    def __init__(self, *, backend, sources, segments, dest, config, capacity):
        self.backend = backend
        self.hidden = dest.shape[1]
        self.dest_shape = tuple(dest.shape)
        self.dest_dtype = dest.dtype
        self.device = dest.device
        self.src_dtype = sources[0].dtype if sources else dest.dtype
        self.config = config
        self.capacity = capacity
        self.tiles = None
        self.aligned = False
        self.sources = ()
        self.segments = ()
        self.n_tiles = 0
        if backend == "triton":
            self.aligned = is_aligned(sources, dest)
        self._load(sources, segments)

    @property
    def grid(self) -> int:
        return self.n_tiles if self.capacity is None else self.capacity

    def _load(self, sources, segments):
        self.sources = tuple(sources)  # keeps every address in the table alive
        self.segments = tuple(segments)
        if self.backend != "triton":
            return
        table = host_tiles(
            self.segments,
            [s.data_ptr() for s in sources],
            self.hidden * (sources[0].element_size() if sources else 1),
            self.config["BLOCK_M"],
        )
        self.n_tiles = table.shape[0]
        self.tiles = upload(table, self.device, capacity=self.capacity, into=self.tiles)

    def update(self, sources: Sequence, segments: Sequence) -> None:
        """Point the plan at new sources and segments without moving its device table."""
        segments = [Segment(*s) for s in segments]
        dest = _DestSpec(self)
        check_tensors(sources, dest)
        check_segments(segments, [s.shape[0] for s in sources], self.dest_shape[0])
        if sources and sources[0].dtype != self.src_dtype:
            raise KernelInputError(
                f"the plan was made for {self.src_dtype} sources, got {sources[0].dtype}"
            )
        if (
            self.backend == "triton"
            and self.aligned
            and not all(s.data_ptr() % 16 == 0 for s in sources)
        ):
            raise KernelInputError(
                "the plan was compiled for 16-byte aligned sources; a new source is not aligned"
            )
        if (
            self.capacity is not None
            and count_tiles(segments, self.config["BLOCK_M"]) > self.capacity
        ):
            raise KernelInputError(
                f"the new table needs more than the plan's {self.capacity} tiles"
            )
        self._load(sources, segments)


class _DestSpec:
    """Stands in for the destination when re-checking sources against a plan."""

    def __init__(self, plan: SegmentPlan):
        self.shape = plan.dest_shape
        self.device = plan.device
        self.dtype = plan.dest_dtype

    def dim(self):
        return len(self.shape)

    def is_contiguous(self):
        return True


def plan_segments(
    sources: Sequence,
    segments: Sequence,
    dest,
    *,
    config: dict | None = None,
    capacity: int | None = None,
) -> SegmentPlan:
    """Check a segment table against ``sources`` and ``dest`` and prepare it to run."""
    segments = [Segment(*s) for s in segments]
    check_tensors(sources, dest)
    check_segments(segments, [s.shape[0] for s in sources], dest.shape[0])
    backend = select_backend(dest.device)
    if backend == "triton":
        _check_triton_dtypes(sources, dest)
        rows = max(total_rows(segments), 1)
        config = resolve_config(
            KERNEL_NAME,
            dtype=dest.dtype,
            hidden=dest.shape[1],
            n_rows=rows,
            device=dest.device,
            config=config,
        )
    return SegmentPlan(
        backend=backend,
        sources=sources,
        segments=segments,
        dest=dest,
        config=config,
        capacity=capacity,
    )


def run_segments(plan: SegmentPlan, dest) -> None:
    """Launch a plan into ``dest`` (the tensor it was planned for, or one just like it)."""
    if (
        tuple(dest.shape) != plan.dest_shape
        or dest.dtype != plan.dest_dtype
        or dest.device != plan.device
    ):
        raise KernelInputError(
            f"destination {tuple(dest.shape)} {dest.dtype} on {dest.device} differs from the planned"
            f" {plan.dest_shape} {plan.dest_dtype} on {plan.device}"
        )
    if not dest.is_contiguous():
        raise KernelInputError("destination must be contiguous")
    if plan.backend == "torch":
        gather_segments_ref(plan.sources, plan.segments, dest)
        return
    if plan.aligned and dest.data_ptr() % 16:
        raise KernelInputError(
            "the plan was made for a 16-byte aligned destination; this one is not"
        )
    if plan.grid == 0:
        return
    cfg = plan.config if plan.aligned else unaligned_config(plan.config)
    segment_copy_kernel[(plan.grid,)](
        plan.tiles,
        dest,
        plan.hidden,
        SRC_DTYPE=tl_dtype(plan.src_dtype),
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_H=cfg["BLOCK_H"],
        ALIGNED=plan.aligned,
        VEC=vector_width(dest.element_size(), plan.src_dtype.itemsize),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def gather_segments(
    sources: Sequence,
    segments: Sequence,
    out=None,
    *,
    dtype=None,
    config: dict | None = None,
):
    """Copy every segment into a packed destination and return it.

    ``out`` (optional) is written in place and must have at least as many rows as the
    table addresses; rows no segment addresses are left untouched. Without ``out`` a
    buffer of ``total_rows(segments)`` rows is allocated in ``dtype`` (default: the
    sources' dtype); segments are cast to the destination dtype. Bad tables raise
    ``SegmentError`` and bad tensors ``KernelInputError`` before anything is launched.

    Equivalent PyTorch (for a packed, in-order table)::

        out = torch.cat([sources[s][r : r + n] for s, r, n, _ in segments]).to(dtype)
    """
    import torch

    segments = [Segment(*s) for s in segments]
    if out is None:
        if not sources:
            raise KernelInputError("gather_segments needs out= when there are no sources")
        out = torch.empty(
            (total_rows(segments), sources[0].shape[-1]),
            dtype=dtype or sources[0].dtype,
            device=sources[0].device,
        )
    run_segments(plan_segments(sources, segments, out, config=config), out)
    return out
