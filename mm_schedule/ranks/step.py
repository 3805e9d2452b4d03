"""A scheduling step shared by the ranks of a process group.

The scheduler calls two methods between planning and caching:

1. ``agree(plan)``: the agreed miss set replaces each rank's local one (a local hit
   that another rank missed becomes a miss), and the encoder batches are rebuilt from
   it in plan order, so every rank holds the same plan whatever its cache held.
2. ``encode(plan, encode_batches)``: every rank encodes the agreed misses (or, with
   encoder parallelism, its share of them), the ranks settle the outcome (a fault
   anywhere raises the same error everywhere), and in parallel mode the rows are
   exchanged so every rank ends with every miss's rows.

Inserting into the cache happens after ``encode`` returns, i.e. only once every rank
has succeeded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..plan import HIT, MISS, PER_ITEM, Source, StepPlan
from .agreement import agree_misses
from .exchange import DTYPE_CODES, dtype_of, exchange_rows
from .faults import Fault, settle
from .group import RankGroup
from .shards import assign_shards

Batches = list[tuple[str, list[int]]]
EncodeBatches = Callable[[Batches], tuple[int, int]]


def encoder_batches(sources: Sequence[Source], misses: Sequence[int], budget: int | None) -> Batches:
    """Encoder calls for ``misses`` (source indices, plan order), by the planner's rule:
    per-item misses of one modality together (split by the token budget), modalities
    in order of their first miss, then one call per whole-request miss."""
    per_modality: dict[str, list[list[int]]] = {}
    whole: Batches = []
    for i in misses:
        s = sources[i]
        if s.scope != PER_ITEM:
            whole.append((s.modality, [i]))
            continue
        batches = per_modality.setdefault(s.modality, [[]])
        current = batches[-1]
        tokens = sum(sources[j].rows for j in current)
        if budget is not None and current and tokens + s.rows > budget:
            batches.append(current := [])
        current.append(i)
    return [(m, b) for m, batches in per_modality.items() for b in batches] + whole


class RankStep:
    def __init__(self, group: RankGroup, *, encoder_parallel: bool, budget: int | None) -> None:
        self.group = group
        self.encoder_parallel = encoder_parallel
        self.budget = budget

    def agree(self, plan: StepPlan) -> None:
        cached = [i for i, s in enumerate(plan.sources) if s.status in (HIT, MISS)]
        flags = agree_misses(
            self.group,
            [plan.sources[i].key for i in cached],
            [plan.sources[i].rows for i in cached],
            [plan.sources[i].status == MISS for i in cached],
            settings=(self.encoder_parallel, -1 if self.budget is None else self.budget),
        )
        demoted = set()
        for i, miss in zip(cached, flags):
            s = plan.sources[i]
            if miss and s.status == HIT:
                s.status, s.tensor = MISS, None
                demoted.update(id(item) for item in s.items)
        if demoted:
            plan.hit_items = [item for item in plan.hit_items if id(item) not in demoted]
        misses = [i for i, miss in zip(cached, flags) if miss]
        plan.encoder_batches = encoder_batches(plan.sources, misses, self.budget)

    def encode(self, plan: StepPlan, encode_batches: EncodeBatches, device: Any = None) -> tuple[int, int]:
        """Encode this rank's part of the agreed misses; returns ``(calls, items)``."""
        misses = [i for i, s in enumerate(plan.sources) if s.status == MISS]
        if not misses:
            return 0, 0
        group = self.group
        if self.encoder_parallel:
            owners = assign_shards([plan.sources[i].rows for i in misses], group.size)
            owned = [i for i, rank in zip(misses, owners) if rank == group.rank]
            batches = encoder_batches(plan.sources, owned, self.budget)
        else:
            owned, batches = misses, plan.encoder_batches
        calls = items = 0
        fault, cause = None, None
        for batch in batches:
            try:
                c, n = encode_batches([batch])
            except Exception as exc:  # reported to every rank by settle(), then raised there
                first = plan.sources[batch[1][0]]
                fault = Fault.from_exception(
                    exc, rank=group.rank, request=first.request, item_hash=_hash_of(first)
                )
                cause = exc
                break
            calls, items = calls + c, items + n
        hidden = code = 0
        if fault is None and owned:
            fault, hidden, code = self._output_shape(plan, owned)
        hidden, code = settle(group, fault, hidden=hidden, dtype_code=code, cause=cause)
        if self.encoder_parallel:
            rows = [plan.sources[i].rows for i in misses]
            mine = {j: plan.sources[i].tensor for j, i in enumerate(misses) if owners[j] == group.rank}
            tensors = exchange_rows(
                group, owners, rows, mine, hidden=hidden, dtype=dtype_of(code),
                device=device if device is not None else group.device,
            )
            for i, tensor in zip(misses, tensors):
                plan.sources[i].tensor = tensor
        return calls, items

    def _output_shape(self, plan: StepPlan, owned: Sequence[int]) -> tuple[Fault | None, int, int]:
        """``(fault, hidden, dtype code)`` of this rank's outputs. Rows are exchanged in
        one buffer, so in parallel mode they must share one hidden size and dtype."""
        first = plan.sources[owned[0]].tensor
        hidden, dtype = first.shape[-1], first.dtype
        code = DTYPE_CODES.get(dtype, 0)
        if not self.encoder_parallel:
            return None, hidden, code
        for i in owned:
            t = plan.sources[i].tensor
            if t.shape[-1] != hidden or t.dtype != dtype or code == 0:
                s = plan.sources[i]
                fault = Fault(
                    rank=self.group.rank, request=s.request, item_hash=_hash_of(s), error="EncoderOutputError",
                    message=(
                        f"encoder-parallel steps exchange rows of one floating dtype and hidden size; got "
                        f"{tuple(t.shape)} {t.dtype} after {tuple(first.shape)} {dtype}"
                    ),
                )
                return fault, 0, 0
        return None, hidden, code


def _hash_of(source: Source) -> int | None:
    return getattr(source.items[0], "hash", None) if source.items else None


def rank_step(context: Any) -> RankStep | None:
    """The step's rank coordinator, or None when the step runs on one rank."""
    if context.group is None:
        return None
    group = RankGroup(context.group, context.rows_group)
    if group.size == 1:
        return None
    return RankStep(
        group, encoder_parallel=context.encoder_parallel, budget=context.max_tokens_per_encoder_call
    )
