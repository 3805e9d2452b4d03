"""Planning a prefill step on the host: which item rows the step needs and where they go.

Nothing here reads tensor data or changes the cache. A plan lists *sources* (one per
distinct embedding the step needs: a cached entry, a precomputed embedding, or an
encoder output still to be computed) and *segments* saying which rows of which source
land where, both in the packed ``[n_rows, H]`` layout and in the forward batch's token
rows. Misses are deduplicated across requests and grouped into encoder batches (one
call per modality, optionally capped by a token budget).

* ``columns``: ``StepPlan`` (parallel columns, never one object per item), ``RequestChunk``
  and the batching rule; ``StepPlan.with_lookups`` marks the cached sources, through a
  read-only lookup the step passes in;
* ``flat``: the common step in one pass (every item one span, nothing precomputed,
  items in position order), the pass over the items in C (``_flat_columns.c``) where
  the extension was compiled;
* ``general``: everything else (several spans per item, precomputed embeddings, items
  out of order) and every malformed input, so each error names what is wrong;
* ``entry``: ``plan_step`` / ``plan_columns``, which pick the planner, and ``request_columns``.
"""

from .columns import (
    HIT,
    MISS,
    PRECOMPUTED,
    RequestChunk,
    SegmentView,
    SourceKind,
    SourceView,
    Span,
    StepPlan,
    batch_misses,
)
from .entry import as_requests, plan_columns, plan_step, request_columns

__all__ = [
    "HIT", "MISS", "PRECOMPUTED", "RequestChunk", "SegmentView", "SourceKind", "SourceView", "Span", "StepPlan",
    "as_requests", "batch_misses", "plan_columns", "plan_step", "request_columns",
]
