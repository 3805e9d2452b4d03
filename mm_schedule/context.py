"""What the scheduler needs to know about its process group, passed in explicitly.

SGLang reads these from a process-wide runtime context; here they are an argument,
so a CPU test builds one in a line and nothing needs patching.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import methodcaller
from typing import Any


@dataclass(frozen=True)
class ParallelContext:
    attn_tp_rank: int = 0
    attn_tp_size: int = 1
    tp_size: int = 1


def acknowledge_deferred_ipc(items: Sequence[Any], parallel: ParallelContext) -> None:
    """Release lazily reconstructed CUDA-IPC features of items whose embedding came
    from the cache, so the sender's pool slot is freed although the encoder never
    read it. Exactly one rank (attention-TP rank 0) acknowledges, on behalf of all
    ``tp_size`` consumers, as SGLang's transport expects.

    Opt-in (``StepContext(on_cache_hit=acknowledge_deferred_ipc)``): a released slot may be
    reused by the sender, so an item whose entry is evicted before a later chunk of its
    request would be encoded from another image's bytes. SGLang's batched per-image path
    never acknowledges hits, and from 0.5.22 no path does (the leases last until request
    cleanup, which releases every item's feature)."""
    if parallel.attn_tp_rank != 0:
        return
    consumers = max(parallel.tp_size, 1)
    if all(callable(getattr(kind, _ACK, None)) for kind in set(map(type, items))):
        # Every item's class has the method (the usual case: one item type): the calls
        # run from C, a thousand cached images cost no bytecode loop.
        deque(map(methodcaller(_ACK, consumers), items), maxlen=0)
        return
    for item in items:
        ack = getattr(item, _ACK, None)
        if ack is not None:
            ack(consumers)


_ACK = "acknowledge_deferred_cuda_ipc_feature"


AckHook = Callable[[Sequence[Any], ParallelContext], None]


@dataclass(frozen=True)
class StepContext:
    """Per-engine settings of a scheduling step."""

    parallel: ParallelContext = ParallelContext()
    # Called once per successful step with every request's item served from the cache.
    # None: hits keep their transport leases until the engine releases the request
    # (see acknowledge_deferred_ipc for why that is the safe default).
    on_cache_hit: AckHook | None = None
    # Upper bound on placeholder tokens per encoder call; None = one call per modality.
    max_tokens_per_encoder_call: int | None = None
    # A torch.distributed process group whose ranks schedule this same step (an
    # engine's tensor-parallel group; its CPU/gloo group if it has one). None: one rank.
    group: Any = None
    # With ``group``: split the agreed misses across the ranks (balanced by tokens),
    # each encodes its share, rows are exchanged. Off: every rank encodes every miss.
    encoder_parallel: bool = False
    # Group the rows of an encoder-parallel step travel over (e.g. the engine's GPU
    # group beside a CPU ``group``); None: ``group``.
    rows_group: Any = None
