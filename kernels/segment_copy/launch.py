"""The segment copy's launchers: rows of many source tensors copied by one kernel launch.

A segment ``(source, src_row, n_rows, dst_row)`` copies
``sources[source][src_row : src_row + n_rows]`` to ``dest[dst_row : dst_row + n_rows]``.
The destination is either a packed ``[n_rows, H]`` buffer (``gather_segments``) or the
text ``input_embeds`` itself (``merge_segments``); both run ``kernel.segment_copy_kernel``.

Equivalent PyTorch::

    for source, src_row, n_rows, dst_row in segments:
        dest[dst_row : dst_row + n_rows] = sources[source][src_row : src_row + n_rows].to(dest.dtype)

The table (``table.py``) holds the segments as given and the address of every source; a
single segment needs no table at all: its address and rows travel as launch arguments
(``ONE_SEGMENT``).

Three ways in, one launch:

- ``gather_segments`` / ``merge_segments``: check everything, stage the table, launch.
- ``plan_segments`` + ``run_segments``: check and upload once, launch many times (CUDA
  graphs; see ``SegmentPlan``).
- ``launch_trusted``: the scheduler's own tables, already checked by its planner
  (reached through ``trusted.copy_segments``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

import torch

from ...errors import GraphCaptureError, KernelInputError, SegmentError, SourceOverlapError
from .._triton import tl_dtype
from ..backend import select_backend
from ..dtypes import SUPPORTED_DTYPES, vector_width
from ..launch_config import row_bucket, unaligned_config
from ..streams import HOST_LAYER, layer
from ..tuned_configs import on_clear, resolve_config
from .contract import INT32_MAX, Segment, check_segments, check_tensors, total_rows
from .fast_launch import LaunchSpec
from .kernel import segment_copy_kernel
from .table import (
    build_table,
    count_tiles,
    pinned_words,
    table_size,
    table_words,
    upload,
    whole_table,
)

KERNEL_NAME = "segment_gather"



def gather_segments_ref(sources: Sequence, segments: Sequence[Segment], out) -> None:
    """Plain-torch reference and CPU fallback: one ``copy_`` per segment (casts like ``.to``)."""
    for source, src_row, n_rows, dst_row in segments:
        out[dst_row : dst_row + n_rows].copy_(sources[source][src_row : src_row + n_rows])


# --- the launch shared by every way in -------------------------------------------------


class _Launch(NamedTuple):
    spec: LaunchSpec
    block_m: int
    vec: int


@lru_cache(maxsize=4096)
def _launch_for(device, dtype, src_dtype, hidden: int, bucket: int, vec: int, one: bool, config_items):
    """Everything about a launch that follows from its shape, resolved once per shape and
    row bucket (``launch_config.row_bucket``): a new image size costs no lookup."""
    config = dict(config_items) if config_items is not None else None
    cfg = resolve_config(
        KERNEL_NAME, dtype=dtype, hidden=hidden, n_rows=bucket, device=device, config=config
    )
    return _make_launch(src_dtype, hidden, vec, one, cfg)


def _make_launch(src_dtype, hidden, vec, one, cfg) -> _Launch:
    if vec == 1:
        cfg = unaligned_config(cfg)
    constexprs = {
        "SRC_DTYPE": tl_dtype(src_dtype),
        "BLOCK_M": cfg["BLOCK_M"],
        "BLOCK_H": cfg["BLOCK_H"],
        "VEC": vec,
        "EVEN_H": hidden % cfg["BLOCK_H"] == 0,
        "ONE_SEGMENT": one,
    }
    options = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    return _Launch(LaunchSpec(segment_copy_kernel, constexprs, options), cfg["BLOCK_M"], vec)


# New tuning files (``tuned_configs.clear_cache``) make every resolved launch stale.
on_clear(_launch_for.cache_clear)


def _launch(launch: _Launch, dest, grid, table, one, stream) -> None:
    """One launch of ``segment_copy_kernel``; ``one`` is ``(address, dst_row, rows)`` or None."""
    if table is None:
        args = (None, dest, dest.shape[1] // launch.vec, *one)
        # Triton types an integer argument by its value: i32 below 2**31, i64 above.
        variant = (dest.data_ptr() % 16 == 0, one[0] > 0x7FFFFFFF)
    else:
        args = (table, dest, dest.shape[1] // launch.vec, 0, 0, 0)
        variant = (dest.data_ptr() % 16 == 0, table.data_ptr() % 16 == 0)
    launch.spec.launch(grid, args, variant, stream)


def launch_segments(
    sources: Sequence,
    segments: Sequence,
    dest,
    config: dict | None = None,
    *,
    refuse_capture=False,
    static_sources=False,
) -> None:
    """Stage and launch a table that is already known to be valid (no checks here).

    Runs under ``dest``'s device; the table is uploaded on that device's current stream
    and the kernel launched right after it on the same stream. ``refuse_capture``: raise
    ``GraphCaptureError`` instead of launching while a CUDA graph is captured — always
    for a staged table, and for one segment unless ``static_sources`` (the graph keeps
    the source's address as a launch argument).
    """
    if not segments:
        return
    hidden = dest.shape[1]
    first = sources[0]
    itemsize = first.element_size()
    vec = vector_width(dest.element_size(), itemsize)
    even_rows = hidden % vec == 0 and dest.data_ptr() % 16 == 0
    config_items = None if config is None else tuple(sorted(config.items()))
    device = dest.device
    streams = layer(device)
    with streams.guard(device):
        stream = streams.current_raw(device)
        if len(segments) == 1:
            # One segment travels as launch arguments: no table, nothing staged.
            source, src_row, n_rows, dst_row = segments[0]
            if dst_row + n_rows > INT32_MAX:
                # The launch's compiled handle takes these as 32-bit integers.
                raise SegmentError(
                    f"segment {tuple(segments[0])}: destination rows up to {dst_row + n_rows} do not"
                    f" fit the kernel's 32-bit row arguments (at most {INT32_MAX})"
                )
            if refuse_capture and not static_sources and streams.capturing(device):
                raise GraphCaptureError(_ONE_SEGMENT_CAPTURE_HINT)
            address = sources[source].data_ptr() + src_row * hidden * itemsize
            if not (even_rows and address % 16 == 0):
                vec = 1
            launch = _launch_for(device, dest.dtype, first.dtype, hidden, row_bucket(n_rows), vec, True,
                                 config_items)
            _launch(launch, dest, -(-n_rows // launch.block_m), None, (address, dst_row, n_rows), stream)
            return
        if refuse_capture and streams.capturing(device):
            raise GraphCaptureError(_CAPTURE_HINT)
        # Tiles and grid follow the rows the table copies, which the packer counts: two
        # images merged into a long prompt get the tiles of two images, not of the prompt.
        chosen = []

        def block_m_for(rows):
            chosen.append(_launch_for(device, dest.dtype, first.dtype, hidden, row_bucket(rows), vec,
                                      False, config_items))
            return chosen[0].block_m

        table, sources_aligned, slot, rows, tiles = build_table(
            segments, sources, device, streams.staging_ring(device), block_m_for
        )
        try:
            launch = chosen[0]
            if not (even_rows and sources_aligned) and vec > 1:
                # The unaligned variant: the same tile height (so the same table), narrower steps.
                launch = _launch_for(device, dest.dtype, first.dtype, hidden, row_bucket(rows), 1, False,
                                     config_items)
            if tiles:
                _launch(launch, dest, tiles, table, None, stream)
        finally:
            if slot is not None:
                # After the launch: the slot's event must follow the kernel that reads it.
                slot.launched()


_host_tables = threading.local()


def _host_table_buffer(n_words: int):
    """An int64 CPU table of ``n_words`` over this thread's reused host buffer (what the
    staging ring's pinned slots are on a GPU): made without dispatching an operator, and
    read before the call returns (the interpreter's launch, a dry run's upload)."""
    buffer = getattr(_host_tables, "buffer", None)
    if buffer is None or len(buffer) < 8 * n_words:
        buffer = _host_tables.buffer = bytearray(8 << (n_words - 1).bit_length())
    return torch.frombuffer(buffer, dtype=torch.int64, count=n_words)


def launch_whole_sources(addresses: list, rows: list, dest, src_dtype) -> None:
    """The packed copy of whole sources in order into ``dest`` (segment ``i`` all of source
    ``i``, right after segment ``i - 1``), the sources given by the address of their first
    row and their row counts (lists of ints): one launch, and no tensor read on the host.
    Trusted like ``launch_trusted``: the sources are ``src_dtype``, ``dest``'s hidden size,
    row-contiguous, on ``dest``'s device and alive until the copy has run; ``dest`` has
    ``sum(rows)`` rows. Refused under CUDA-graph capture (the table is staged per call).

    On ``meta`` (a dry run) the host work of the launch is done, the table packed and its
    upload dispatched, and the launch itself skipped: there is no data to copy."""
    hidden = dest.shape[1]
    vec = vector_width(dest.element_size(), src_dtype.itemsize)
    device = dest.device
    # The tile height follows the rows the table copies (a plan's rows, known up front).
    launch = _launch_for(device, dest.dtype, src_dtype, hidden, row_bucket(dest.shape[0]), vec, False, None)
    streams = layer(device)
    if streams is HOST_LAYER:
        table, aligned, _, _, tiles = whole_table(rows, addresses, None, launch.block_m, host=_host_table_buffer)
        if device.type == "meta":
            table.to(device)  # the upload a GPU makes; nothing to launch without data
            return
        slot = None
    with streams.guard(device):
        if streams is not HOST_LAYER:
            if streams.capturing(device):
                raise GraphCaptureError(_CAPTURE_HINT)
            table, aligned, slot, _, tiles = whole_table(rows, addresses, streams.staging_ring(device), launch.block_m)
        try:
            if not (aligned and hidden % vec == 0 and dest.data_ptr() % 16 == 0) and vec > 1:
                # The unaligned variant: the same tile height (so the same table), narrower steps.
                launch = _launch_for(device, dest.dtype, src_dtype, hidden, row_bucket(dest.shape[0]), 1, False,
                                     None)
            if tiles:
                _launch(launch, dest, tiles, table, None, streams.current_raw(device))
        finally:
            if slot is not None:
                slot.launched()  # after the launch: the slot's event must follow the kernel that reads it


def launch_trusted(sources: Sequence, segments: Sequence, dest, *, static_sources=False) -> None:
    """The scheduler's Triton path: its planner already checked the table, so nothing is
    checked again. Under CUDA-graph capture a table of several segments is refused (it is
    staged per call: the graph would replay a recycled buffer), and so is one segment
    unless ``static_sources`` says its source stays at its address while the graph can be
    replayed (the launch carries that address, which every replay reads again)."""
    launch_segments(sources, segments, dest, refuse_capture=True, static_sources=static_sources)


# --- checks of the public API ----------------------------------------------------------

_CAPTURE_HINT = (
    "this call stages its segment table on every call, which a CUDA graph would replay"
    " from a recycled buffer; build a plan before capturing (plan_segments(..., capacity=N))"
    " and capture only run_segments(plan, dest)"
)


_ONE_SEGMENT_CAPTURE_HINT = (
    "copy_segments was called while a CUDA graph is being captured: the graph would keep this"
    " call's source address and read it on every replay, after the source may have been freed;"
    " pass static_sources=True if the sources stay alive at fixed addresses for as long as the"
    " graph, or capture run_segments of a plan"
)


def refuse_under_capture(device, what: str) -> None:
    if layer(device).capturing(device):
        raise GraphCaptureError(f"{what} was called while a CUDA graph is being captured: {_CAPTURE_HINT}")


def check_no_overlap(sources: Sequence, dest) -> None:
    """Refuse a source whose bytes overlap the destination's: programs of one launch would
    read rows that other programs are overwriting. (Sources are on ``dest``'s device.)"""
    start = dest.data_ptr()
    end = start + dest.nbytes
    for i, src in enumerate(sources):
        s_start = src.data_ptr()
        s_end = s_start + src.nbytes
        if s_start < end and start < s_end and s_start < s_end:
            raise SourceOverlapError(
                f"source {i} shares memory with the destination (bytes [{s_start:#x}, {s_end:#x}) and"
                f" [{start:#x}, {end:#x})); copy it first (.clone()) or write to another buffer"
            )


def is_aligned(sources: Sequence, dest) -> bool:
    """True when 16-byte vector access is valid for every row of every source and of ``dest``."""
    itemsizes = [dest.element_size()] + [s.element_size() for s in sources[:1]]
    if dest.shape[1] % vector_width(*itemsizes):
        return False
    return all(t.data_ptr() % 16 == 0 for t in (dest, *sources))


def _check_triton_dtypes(sources: Sequence, dest) -> None:
    # check_tensors already made every source share source 0's dtype.
    for what, dtype in [("destination", dest.dtype)] + [("source 0", s.dtype) for s in sources[:1]]:
        if str(dtype).removeprefix("torch.") not in SUPPORTED_DTYPES:
            raise KernelInputError(
                f"{what} has dtype {dtype}; the Triton kernel supports bfloat16, float16 and float32"
                " (set MM_SCHEDULE_KERNEL_BACKEND=torch for other dtypes)"
            )


def checked_backend(sources: Sequence, segments: Sequence, dest) -> tuple[str, list[Segment]]:
    """Every check of the public API; returns the backend that will run and the table
    as plain-int segments."""
    check_tensors(sources, dest)
    segments = check_segments(segments, [s.shape[0] for s in sources], dest.shape[0])
    check_no_overlap(sources, dest)
    backend = select_backend(dest.device)
    if backend == "triton":
        _check_triton_dtypes(sources, dest)
    return backend, segments


def copy_checked(sources: Sequence, segments: Sequence, dest, *, config=None, what: str) -> None:
    """Check, then copy with whichever backend runs (the public per-call path)."""
    refuse_under_capture(dest.device, what)
    backend, segments = checked_backend(sources, segments, dest)
    if backend == "torch":
        gather_segments_ref(sources, segments, dest)
    else:
        launch_segments(sources, segments, dest, config)


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
    ``SegmentError``, bad tensors ``KernelInputError`` (``SourceOverlapError`` for a
    source sharing memory with ``out``) before anything is launched. Not for CUDA-graph
    capture (``GraphCaptureError``): capture ``run_segments`` of a plan instead.

    Equivalent PyTorch (for a packed, in-order table)::

        out = torch.cat([sources[s][r : r + n] for s, r, n, _ in segments]).to(dtype)
    """
    if out is None:
        if not sources:
            raise KernelInputError("gather_segments needs out= when there are no sources")
        segments = check_segments(segments, [s.shape[0] for s in sources], float("inf"))
        out = torch.empty(
            (total_rows(segments), sources[0].shape[-1]),
            dtype=dtype or sources[0].dtype,
            device=sources[0].device,
        )
    copy_checked(sources, segments, out, config=config, what="gather_segments")
    return out


def merge_segments(
    sources: Sequence, segments: Sequence, input_embeds, *, config: dict | None = None
):
    """Write every segment into ``input_embeds`` (in place, cast to its dtype) and return it:
    the fused merge, no packed intermediate buffer, no boolean mask, no host sync.

    ``input_embeds`` is ``[tokens, H]`` (flattened over the batch); rows no segment names
    keep their text embedding. A source sharing memory with ``input_embeds`` raises
    ``SourceOverlapError``.

    Equivalent PyTorch::

        for s, r, n, d in segments:
            input_embeds[d : d + n] = sources[s][r : r + n].to(input_embeds.dtype)

    Not for CUDA-graph capture (``GraphCaptureError``): plan with
    ``plan_segments(..., capacity=N)`` and ``input_embeds`` as the destination, then
    capture ``run_segments``.
    """
    copy_checked(sources, segments, input_embeds, config=config, what="merge_segments")
    return input_embeds


# --- plan / run ------------------------------------------------------------------------


class SegmentPlan:
    """A checked segment table, uploaded once, ready to launch many times (the
    FlashInfer-style plan/run split).

    ``plan_segments`` does all host work: checks the table against the sources and the
    destination, picks the backend, config and vector width, and uploads the table on
    the destination device's current stream through the plan's pinned staging buffer,
    recording an event after the copy. ``update`` copies through the same buffer when
    that event has completed, through a new one otherwise (it never waits for the
    device).
    ``run_segments`` only launches: no allocation, no host sync. When it runs on another
    stream than the upload, that stream first waits for the upload's event (once per
    stream) and the table is marked in use there, so the launch never reads it early
    and the allocator never recycles it under the kernel.

    CUDA-graph capture: plan (or ``update``) before capturing, with ``capacity`` (tiles)
    so the grid is fixed, and capture only ``run_segments``. Before capturing on a
    stream other than the one that planned, run the plan once on that stream outside
    the capture (a warm-up) — waiting for an event recorded outside a capture is not
    allowed inside one, so ``run_segments`` refuses instead. Between replays keep fixed
    the destination tensor (same storage, dtype, shape), the source dtype, hidden size
    and alignment; the sources may change only through ``update``, outside capture and
    on the stream that replays the graph; new sources must stay alive, at fixed
    addresses, while the graph can be replayed. Keep the plan alive as long as the graph.
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
        self.table = None
        self.staging = None  # the pinned buffer uploads copy through (off the CPU)
        self.vec = 1
        self.sources = ()
        self.segments = ()
        self.n_tiles = 0
        self.upload_stream = None
        self.upload_event = None
        self.ready_streams: list = []
        if backend == "triton":
            if is_aligned(sources, dest):
                self.vec = vector_width(dest.element_size(), self.src_dtype.itemsize)
            self.launch = _make_launch(self.src_dtype, self.hidden, self.vec, False, config)
            if capacity is not None:
                self.table_words = table_size(capacity, max(len(sources), capacity))
        self._load(sources, segments)

    @property
    def aligned(self) -> bool:
        return self.vec > 1

    @property
    def grid(self) -> int:
        return self.n_tiles if self.capacity is None else self.capacity

    def _load(self, sources, segments):
        """Check that the table fits the plan, then (and only then) take it and upload it."""
        if self.backend != "triton":
            self.sources, self.segments = tuple(sources), tuple(segments)
            return
        n_tiles = count_tiles(segments, self.config["BLOCK_M"])
        if self.capacity is not None and n_tiles > self.capacity:
            raise KernelInputError(
                f"the table needs {n_tiles} tiles of {self.config['BLOCK_M']} rows, more than the"
                f" plan's capacity of {self.capacity}; plan with a larger capacity"
            )
        words = table_words(segments, [s.data_ptr() for s in sources], self.config["BLOCK_M"])
        if self.capacity is not None:
            if len(words) > self.table_words:
                raise KernelInputError(
                    f"the table needs {len(words)} words (segments and sources), the plan holds"
                    f" {self.table_words}; plan with a larger capacity"
                )
            words.extend([0] * (self.table_words - len(words)))
        self.sources = tuple(sources)  # keeps every address in the table alive
        self.segments = tuple(segments)
        self.n_tiles = n_tiles
        reuse = self.table is not None and self.table.numel() >= len(words)
        streams = layer(self.device)
        with streams.guard(self.device):
            stream = streams.current(self.device)
            if reuse:
                # Rewriting the table in place: launches queued on other streams may still
                # read it, so the copy waits for everything they have queued so far.
                for other in self.ready_streams:
                    if other != stream:
                        streams.wait(stream, streams.record(other))
            if self.device.type != "cpu" and (
                self.staging is None
                or self.staging.numel() < len(words)
                or not streams.done(self.upload_event)
            ):
                # The last upload's copy may still read the old buffer: never wait for it,
                # take a new one (the pinned-memory cache frees the old after that copy).
                self.staging = pinned_words(len(words))
            self.table = upload(words, self.device, staging=self.staging, into=self.table if reuse else None)
            self.upload_stream = stream
            self.upload_event = streams.record(stream)
            self.ready_streams = [stream]

    def update(self, sources: Sequence, segments: Sequence) -> None:
        """Point the plan at new sources and segments without moving its device table.

        Uploads on the current stream; call it outside graph capture (it stages host
        memory) and on the stream that runs or replays the plan. A table rewritten in
        place is copied only after the work queued so far on every other stream the plan
        ran on (their launches may still read it)."""
        refuse_under_capture(self.device, "SegmentPlan.update")
        check_tensors(sources, _DestSpec(self))
        segments = check_segments(segments, [s.shape[0] for s in sources], self.dest_shape[0])
        if sources and sources[0].dtype != self.src_dtype:
            raise KernelInputError(
                f"the plan was made for {self.src_dtype} sources, got {sources[0].dtype}"
            )
        if self.aligned and not all(s.data_ptr() % 16 == 0 for s in sources):
            raise KernelInputError(
                "the plan was compiled for 16-byte aligned sources; a new source is not aligned"
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

    def is_floating_point(self):
        return self.dtype.is_floating_point


def plan_segments(
    sources: Sequence,
    segments: Sequence,
    dest,
    *,
    config: dict | None = None,
    capacity: int | None = None,
) -> SegmentPlan:
    """Check a segment table against ``sources`` and ``dest`` and prepare it to run."""
    refuse_under_capture(dest.device, "plan_segments")
    backend, segments = checked_backend(sources, segments, dest)
    if backend == "triton":
        config = resolve_config(
            KERNEL_NAME,
            dtype=dest.dtype,
            hidden=dest.shape[1],
            n_rows=max(total_rows(segments), 1),
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
    if plan.aligned and dest.data_ptr() % 16:
        raise KernelInputError(
            "the plan was made for a 16-byte aligned destination; this one is not"
        )
    streams = layer(plan.device)
    with streams.guard(plan.device):
        capturing = streams.capturing(plan.device)
        if capturing and (plan.capacity is None or plan.backend == "torch"):
            raise GraphCaptureError(
                "run_segments is being captured for a plan without capacity (or on the torch"
                " backend): a graph would keep its launch as it is now, and a longer table given to"
                " update() gets a new device table and a larger grid the graph never sees; plan"
                " with plan_segments(..., capacity=N) on the Triton backend to capture"
            )
        if plan.backend == "torch":
            gather_segments_ref(plan.sources, plan.segments, dest)
            return
        if plan.grid == 0:
            return
        stream = streams.current(plan.device)
        if stream not in plan.ready_streams:
            if capturing:
                raise GraphCaptureError(
                    "run_segments is being captured on a stream the plan has never run on; run it"
                    " once on that stream before capturing (a warm-up), or plan while it is current"
                )
            streams.wait(stream, plan.upload_event)
            streams.keep_for(plan.table, stream)
            plan.ready_streams.append(stream)
        _launch(plan.launch, dest, plan.grid, plan.table, None, streams.raw(stream))
