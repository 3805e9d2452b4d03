"""A scheduling step shared by the ranks of a process group.

The scheduler hands the step over at one seam, between planning and encoding:

1. ``agree(plan, expected)``: the step's cache hits are checked (an unfit entry
   is a failure of this rank, reported through the agreement), then the agreed miss set
   replaces each rank's local one (a local hit that another rank missed becomes a
   miss) and the encoder batches are rebuilt from it in plan order, by the planner's
   own rule: every rank returns the same plan, whatever its cache held. With encoder
   parallelism the returned plan's encoder batches are this rank's share only.
2. ``prepare_rows(plan, encoders, expected)``: this rank encodes its batches
   and validates the outputs; the ranks settle the outcome (a fault anywhere raises the
   same error everywhere); in parallel mode the rows are exchanged, so every rank holds
   every miss's rows; only then does the scheduler insert the agreed misses it returns.

Nothing here touches the cache: unfit entries are named in ``Expected.evict`` and what
to insert is returned, for the scheduler to act on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..encode import Encoders, encode_misses
from ..plan import HIT, MISS, PRECOMPUTED, StepPlan, batch_misses
from ..validate import Expected, check_outputs, check_sources, check_tensor, plain_rows
from .agreement import agree_misses
from .exchange import DTYPE_CODES, dtype_of, exchange_rows
from .faults import Fault, raise_agreed_fault, settle
from .group import RankGroup, step_group
from .shards import assign_shards


def _hash_of(plan: StepPlan, source: int) -> int | None:
    return getattr(plan.first_items[source], "hash", None)


class RankStep:
    """One step's part in a process group (a new one per step)."""

    def __init__(self, group: RankGroup, *, encoder_parallel: bool) -> None:
        self.group = group
        self.encoder_parallel = encoder_parallel
        self.tensors: list[Any] = []  # the step's checked source tensors
        self.misses: list[int] = []  # agreed misses, plan order
        self.owners: list[int] = []  # encoding rank of each agreed miss

    def agree(self, plan: StepPlan, expected: Expected) -> StepPlan:
        fault = cause = None
        try:
            self.tensors = list(check_sources(plan, expected))
        except Exception as exc:  # reported to every rank through the agreement
            # The unfit hit is the one validation named for eviction.
            unfit = set(expected.evict)
            culprit = next((i for i, kind in enumerate(plan.kinds) if kind is HIT and plan.keys[i] in unfit), None)
            fault = Fault.from_exception(
                exc, rank=self.group.rank,
                request=None if culprit is None else plan.requests[culprit],
                item_hash=None if culprit is None else _hash_of(plan, culprit),
            )
            cause = exc
        if PRECOMPUTED in plan.kinds:  # precomputed embeddings are never cached: nothing to agree on
            cached = [i for i, kind in enumerate(plan.kinds) if kind is not PRECOMPUTED]
            keys, rows = [plan.keys[i] for i in cached], [plan.rows[i] for i in cached]
        else:
            cached, keys, rows = range(len(plan.kinds)), plan.keys, plan.rows
        flags, someone_failed = agree_misses(
            self.group,
            keys,
            rows,
            [plan.kinds[i] is MISS for i in cached],
            settings=(self.encoder_parallel, -1 if plan.token_budget is None else plan.token_budget),
            failed=fault is not None,
        )
        if someone_failed:
            raise_agreed_fault(self.group, fault, cause)
        self.misses = [i for i, miss in zip(cached, flags) if miss]
        demoted = [i for i, miss in zip(cached, flags) if miss and plan.kinds[i] is HIT]
        for i in demoted:
            self.tensors[i] = None
        agreed = plan.with_misses(demoted) if demoted else plan
        if not self.encoder_parallel:
            return agreed
        self.owners = assign_shards([plan.rows[i] for i in self.misses], self.group.size)
        # This rank's encoder calls: the planner's rule over its own share only.
        mine = list(agreed.kinds)
        for i, rank in zip(self.misses, self.owners):
            if rank != self.group.rank:
                mine[i] = HIT
        batches = batch_misses(mine, plan.rows, plan.modalities, plan.multi_items, plan.token_budget)
        return agreed._replace(encoder_batches=batches)

    def prepare_rows(
        self, plan: StepPlan, encoders: Encoders, expected: Expected, *, move_features: bool = False
    ) -> tuple[list[Any], list[int]]:
        """Phases 4-5 of the step on this rank; returns the tensors by source and the
        agreed misses, whose rows every rank now holds, to cache."""
        tensors = self.tensors
        fault = cause = None
        for batch in plan.encoder_batches:
            one = plan._replace(encoder_batches=(batch,))
            try:
                produced = encode_misses(one, encoders, device=expected.device, move_features=move_features)
                check_outputs(one, produced, tensors, expected)
            except Exception as exc:  # reported to every rank by settle(), then raised there
                first = batch[1][0]
                fault = Fault.from_exception(
                    exc, rank=self.group.rank, request=plan.requests[first], item_hash=_hash_of(plan, first)
                )
                cause = exc
                break
        if self.misses:
            # Outputs are agreed on, and exchanged, per modality: each modality's encoder
            # has one hidden size and dtype, which may differ from another's.
            modalities = sorted({plan.modalities[i] for i in self.misses})
            encoded = [i for _, batch in plan.encoder_batches for i in batch]
            shapes = [(0, 0)] * len(modalities)
            if fault is None:
                fault, shapes = self._output_shapes(plan, tensors, encoded, modalities)
            shapes = settle(self.group, fault, shapes, labels=modalities, cause=cause)
            if self.encoder_parallel:
                for modality, (hidden, code) in zip(modalities, shapes):
                    self._receive(plan, tensors, expected, modality, hidden, code)
        return tensors, self.misses

    def _receive(
        self, plan: StepPlan, tensors: list[Any], expected: Expected, modality: str, hidden: int, code: int
    ) -> None:
        """Every rank's rows of ``modality``'s misses, into ``tensors``."""
        rank = self.group.rank
        units = [(i, owner) for i, owner in zip(self.misses, self.owners) if plan.modalities[i] == modality]
        owners = [owner for _, owner in units]
        rows = [plan.rows[i] for i, _ in units]
        mine = {j: tensors[i] for j, (i, owner) in enumerate(units) if owner == rank}
        device = expected.device if expected.device is not None else self.group.device
        received = exchange_rows(self.group, owners, rows, mine, hidden=hidden, dtype=dtype_of(code), device=device)
        for (i, owner), t in zip(units, received):
            if owner != rank:
                where = f"request {plan.requests[i]}, item hash {_hash_of(plan, i)}"
                tensors[i] = plain_rows(check_tensor(t, expected, where, f"the rows received from rank {owner}"))

    def _output_shapes(
        self, plan: StepPlan, tensors: list[Any], encoded: Sequence[int], modalities: Sequence[str]
    ) -> tuple[Fault | None, list[tuple[int, int]]]:
        """``(fault, (hidden, dtype code) per modality)`` of this rank's outputs. The rows
        of one modality are exchanged in one buffer, so in parallel mode they must share
        one hidden size and a dtype the exchange knows."""
        shapes: dict[str, tuple[int, int, Any]] = {}
        for i in encoded:
            t = tensors[i]
            hidden, dtype = t.shape[-1], t.dtype
            first = shapes.setdefault(plan.modalities[i], (hidden, DTYPE_CODES.get(dtype, 0), dtype))
            if self.encoder_parallel and (first[:2] != (hidden, DTYPE_CODES.get(dtype, 0)) or first[1] == 0):
                fault = Fault(
                    rank=self.group.rank, request=plan.requests[i], item_hash=_hash_of(plan, i),
                    error="EncoderOutputError",
                    message=(
                        f"encoder-parallel steps exchange the rows of one modality ({plan.modalities[i]}) in one"
                        f" floating dtype ({', '.join(str(d) for d in DTYPE_CODES)}) and one hidden size; got"
                        f" hidden {hidden} {dtype} beside hidden {first[0]} {first[2]}"
                    ),
                )
                return fault, [(0, 0)] * len(modalities)
        return None, [shapes.get(m, (0, 0, None))[:2] for m in modalities]


def rank_step(context: Any) -> RankStep | None:
    """The step's rank coordinator, or None when the step runs on one rank."""
    group = step_group(context)
    return None if group is None else RankStep(group, encoder_parallel=context.encoder_parallel)
