"""What the tuner times per kernel: one *case* class each (``registry`` names them).

A case owns the buffers for one (kernel, shape) on a device: several independent
input/output sets, a launcher per set and config that has done its host-side planning
already, and a bit-exact check against the kernel's torch reference into poisoned
output. ``timing`` turns the launchers into microseconds. torch and the kernels are
imported on first use, never at import time.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

from .space import Shape

# More sets add graph-capture time and memory without making the caches any colder.
MAX_BUFFER_SETS = 64
# Text tokens are drawn above this id, so no text token is taken for a placeholder.
PLACEHOLDER_ID = 7
# Items in a real prompt are separated by text (newlines, image tags); the gap makes the
# merge skip text rows as it does in serving.
TEXT_ROWS_BETWEEN_ITEMS = 16


class Case(ABC):
    """Buffers for one (kernel, shape) on a device: ``n_sets`` independent input/output
    sets, a launcher per set and config, and a bit-exact check against the reference."""

    def __init__(self, shape: Shape, device, n_sets: int, item_rows: int, seed: int):
        import torch

        self.shape = shape
        self.device = device
        self.dtype = getattr(torch, shape.dtype)
        self.item_rows = item_rows
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.sets = [self.make_set() for _ in range(n_sets)]

    def random(self, rows: int):
        import torch

        return torch.randn((rows, self.shape.hidden), generator=self.gen, device=self.device).to(
            self.dtype
        )

    def item_sizes(self) -> list[int]:
        full, rest = divmod(self.shape.n_rows, self.item_rows)
        return [self.item_rows] * full + ([rest] if rest else [])

    @staticmethod
    def set_bytes(shape: Shape, itemsize: int) -> int:
        """Bytes one set moves: ``n_rows`` rows read and as many written."""
        return 2 * shape.n_rows * shape.hidden * itemsize

    @abstractmethod
    def make_set(self):
        """One set of input and output buffers for this kernel and shape."""

    @abstractmethod
    def launcher(self, buffers, config: dict) -> Callable[[], None]:
        """Do all host-side planning now; the returned callable only launches."""

    @abstractmethod
    def check(self, config: dict) -> str | None:
        """Run once into poisoned buffers; a message if any element differs from the reference."""


def _same_bits(a, b) -> bool:
    """Equality of the bit patterns, so the NaN poison compares equal to itself."""
    import torch

    as_int = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.view(as_int), b.view(as_int))


class GatherCase(Case):
    """``segment_gather``: one source tensor per item (cache entries), packed destination."""

    def make_set(self):
        import torch

        sources = [self.random(n) for n in self.item_sizes()]
        segments, row = [], 0
        for i, n in enumerate(self.item_sizes()):
            segments.append((i, 0, n, row))
            row += n
        out = torch.empty(
            (self.shape.n_rows, self.shape.hidden), dtype=self.dtype, device=self.device
        )
        return sources, segments, out

    def launcher(self, buffers, config):
        from ..segment_copy.launch import plan_segments, run_segments

        sources, segments, out = buffers
        plan = plan_segments(sources, segments, out, config=config)
        return lambda: run_segments(plan, out)

    def check(self, config):
        from ..segment_copy.launch import gather_segments_ref

        sources, segments, out = self.sets[0]
        out.fill_(float("nan"))
        expected = out.clone()
        gather_segments_ref(sources, segments, expected)
        self.launcher(self.sets[0], config)()
        if not _same_bits(out, expected):
            return "wrong result: the packed output differs from gather_segments_ref"
        return None


class PlaceholderMergeCase(Case):
    """``placeholder_merge``: ``merge_by_placeholder_ids`` over a token sequence of items
    separated by runs of text tokens; ``n_rows`` counts all tokens, as the launcher does."""

    def make_set(self):
        import torch

        ids = torch.randint(
            PLACEHOLDER_ID + 1, 32000, (self.shape.n_rows,), generator=self.gen, device=self.device
        )
        pos = 0
        while pos < self.shape.n_rows:
            ids[pos : pos + self.item_rows] = PLACEHOLDER_ID
            pos += self.item_rows + TEXT_ROWS_BETWEEN_ITEMS
        n_mm = int((ids == PLACEHOLDER_ID).sum())
        return ids, self.random(n_mm), self.random(self.shape.n_rows)

    def launcher(self, buffers, config):
        from ..placeholder_merge import merge_by_placeholder_ids

        ids, embeddings, input_embeds = buffers
        return lambda: merge_by_placeholder_ids(
            ids, PLACEHOLDER_ID, embeddings, input_embeds, config=config
        )

    def check(self, config):
        from ..placeholder_merge import merge_by_placeholder_ids_ref

        ids, embeddings, input_embeds = self.sets[0]
        input_embeds[ids == PLACEHOLDER_ID] = float("nan")
        expected = input_embeds.clone()
        merge_by_placeholder_ids_ref(ids, PLACEHOLDER_ID, embeddings, expected)
        self.launcher(self.sets[0], config)()
        if not _same_bits(input_embeds, expected):
            return "wrong result: input_embeds differs from merge_by_placeholder_ids_ref"
        return None


def buffer_sets(shape: Shape, itemsize: int, device, cold_bytes: int) -> int:
    """Enough sets that together they exceed ``cold_bytes`` (capped by memory and count)."""
    import torch

    per_set = Case.set_bytes(shape, itemsize)
    wanted = max(2, math.ceil(cold_bytes / per_set))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        wanted = min(wanted, max(1, free // 4 // per_set))
    return max(1, min(wanted, MAX_BUFFER_SETS))


CASES = {"segment_gather": GatherCase, "placeholder_merge": PlaceholderMergeCase}
