"""Where the stand-in departs from SGLang on purpose, each behind one switch.

``differences`` is the live setting the stand-in reads on every call. Each field is True
by default (mm_schedule's behaviour); set it False for SGLang's:

* ``batch_on_every_backend``: misses of all requests are encoded together on every
  backend. SGLang encodes request by request on ROCm, Ascend (NPU) and XPU.
* ``own_storage``: a cache entry is a copy owning exactly its rows. SGLang 0.5.18 and
  0.5.19 cache ``torch.split`` views of a combined encoder output, so one cached image
  keeps the whole batch output alive while the byte budget is charged only its own rows
  (from 0.5.20 SGLang clones such views too, and the switch changes nothing).
* ``raise_on_count_mismatch``: placeholder tokens in ``input_ids`` that disagree with the
  items' offsets, or embedding rows that disagree with either, raise
  ``EmbeddingLengthMismatch``. SGLang checks ``input_ids`` only when its async probe is
  enabled, and for rows logs a warning and keeps the last ones (too many) or raises
  ``RuntimeError`` (too few).

``sglang_behaviour()`` switches all three off for the duration of a ``with`` block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager


@dataclasses.dataclass
class Differences:
    batch_on_every_backend: bool = True
    own_storage: bool = True
    raise_on_count_mismatch: bool = True


differences = Differences()


@contextmanager
def sglang_behaviour(**fields: bool) -> Iterator[Differences]:
    """Every difference switched to SGLang's behaviour (or only the ``fields`` given)."""
    saved = dataclasses.replace(differences)
    chosen = fields or {f.name: False for f in dataclasses.fields(Differences)}
    for name, value in chosen.items():
        if not hasattr(differences, name):
            raise AttributeError(f"no difference named {name!r}; known: {[f.name for f in dataclasses.fields(Differences)]}")
        setattr(differences, name, value)
    try:
        yield differences
    finally:
        for f in dataclasses.fields(Differences):
            setattr(differences, f.name, getattr(saved, f.name))
