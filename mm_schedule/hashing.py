"""Content hashes for multimodal items: the key under which an embedding is cached.

The contract: two items get the same hash only if the encoder must produce the same
rows for them. So the digest covers everything, besides the pixels, that changes the
embedding:

* the raw bytes of the tensor, its dtype and its shape;
* the grid ``(t, h, w)`` of each image or video when the pixels are flattened patch
  rows (Qwen2-VL's layout ``[t*h*w, C*T*P*P]``): the same rows under another grid are a
  different image (the vision tower reshapes and position-encodes by the grid), so a
  rank-2 tensor without its grid is refused rather than hashed;
* the modality;
* a model identity chosen by the caller (checkpoint name and revision, plus anything
  else that changes the weights or the vision config: a LoRA, a dtype).

The digest is BLAKE2b (8 bytes, a fixed personalisation), not Python's ``hash``: it is
the same in every process and on every rank, so ranks that each hash their own copy of
a request agree on cache hits. The value is a non-negative 63-bit ``int`` (it fits a
signed int64 tensor). Hashing reads the tensor on the host: a device tensor is copied
back first, so hash where the pixels are produced (the processor's CPU output).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from .errors import InvalidItemError
from .items import modality_name

_PERSON = b"mm-schedule-v1"
_MASK_63 = (1 << 63) - 1


def content_hash(
    data: Any,
    *,
    model: str,
    modality: Any = "IMAGE",
    grid: Sequence[int] | Any | None = None,
) -> int:
    """Stable hash of one item's encoder input (see the module docstring for the contract).

    ``data``: a torch tensor. ``model``: a non-empty model identity. ``grid``: the
    item's ``(t, h, w)`` patch grid (a sequence of ints or a tensor of three); required
    when ``data`` is rank 2 (flattened patch rows), and then ``t*h*w`` must equal its
    row count.
    """
    import torch

    if not isinstance(data, torch.Tensor):
        raise TypeError(f"content_hash needs a torch tensor, got {type(data).__name__}")
    if not isinstance(model, str) or not model:
        raise InvalidItemError("content_hash needs a non-empty model identity (checkpoint name and revision)")
    grid_tuple = _grid(grid)
    if data.dim() == 2 and grid_tuple is None:
        raise InvalidItemError(
            f"pixels of shape {tuple(data.shape)} are flattened patch rows: pass their grid (t, h, w);"
            " the same rows under another grid are another image"
        )
    if grid_tuple is not None and data.dim() == 2:
        t, h, w = grid_tuple
        if t * h * w != data.shape[0]:
            raise InvalidItemError(
                f"grid {grid_tuple} describes {t * h * w} patch rows, the pixels have {data.shape[0]}"
            )
    header = "|".join(
        (
            modality_name(modality),
            model,
            str(data.dtype),
            ",".join(map(str, data.shape)),
            ",".join(map(str, grid_tuple)) if grid_tuple is not None else "-",
        )
    ).encode()
    digest = hashlib.blake2b(digest_size=8, person=_PERSON)
    digest.update(len(header).to_bytes(4, "little"))
    digest.update(header)
    host = data.detach().to("cpu").contiguous()
    # Viewed as bytes, so bfloat16 and other dtypes numpy lacks hash the same way.
    digest.update(host.reshape(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(digest.digest(), "little") & _MASK_63


def _grid(grid: Any) -> tuple[int, int, int] | None:
    if grid is None:
        return None
    values = grid.reshape(-1).tolist() if hasattr(grid, "reshape") else list(grid)
    if len(values) != 3 or any(int(v) <= 0 for v in values):
        raise InvalidItemError(f"a grid is three positive sizes (t, h, w), got {values}")
    return tuple(int(v) for v in values)
