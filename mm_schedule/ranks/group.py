"""The few collectives a step needs, over the process group the engine passes in.

Failures of the backend become typed errors: a peer that never reaches a collective
shows up (after the group's own timeout, set where the engine creates the group) as
``RankTimeoutError``; any other backend failure as ``RankCommunicationError``. gloo
reports both as a plain ``RuntimeError`` whose text says "Timed out" or "timeout".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..errors import RankCommunicationError, RankTimeoutError


def _tensor_device(group: Any) -> torch.device:
    # A gloo group (also "cpu:gloo,cuda:nccl") takes host tensors; a NCCL/RCCL-only
    # group needs them on the current GPU.
    backend = str(dist.get_backend(group))
    if "gloo" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


class RankGroup:
    """A process group plus its rank and size, with error translation.

    ``group`` carries the small host-side collectives (agreement, status); the rows of
    an encoder-parallel step travel over ``rows_group`` (default: the same group), so an
    engine can keep the former on its CPU group and the latter on its GPU group.
    """

    def __init__(self, group: Any, rows_group: Any = None) -> None:
        self.group = group
        self.rows_group = group if rows_group is None else rows_group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.device = _tensor_device(group)

    def all_reduce_max(self, values: list[int], what: str) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        self._run(what, lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group))
        return t.tolist()

    def all_gather_ints(self, values: list[int], what: str) -> list[list[int]]:
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        out = [torch.empty_like(t) for _ in range(self.size)]
        self._run(what, lambda: dist.all_gather(out, t, group=self.group))
        return [o.tolist() for o in out]

    def all_gather_objects(self, obj: Any, what: str) -> list[Any]:
        out: list[Any] = [None] * self.size
        self._run(what, lambda: dist.all_gather_object(out, obj, group=self.group))
        return out

    def all_gather_rows(self, send: torch.Tensor, what: str) -> list[torch.Tensor]:
        out = [torch.empty_like(send) for _ in range(self.size)]
        self._run(what, lambda: dist.all_gather(out, send, group=self.rows_group))
        return out

    def _run(self, what: str, collective) -> None:
        try:
            collective()
        except RuntimeError as exc:  # DistBackendError and gloo's errors are RuntimeErrors
            text = str(exc)
            where = f"rank {self.rank} of {self.size}: {what}"
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise RankTimeoutError(
                    f"{where}: a rank did not arrive within the group's timeout ({text.strip()})"
                ) from exc
            raise RankCommunicationError(f"{where}: collective failed ({text.strip()})") from exc


def step_group(context: Any) -> RankGroup | None:
    """The step context's process group, or None when the step runs on one rank."""
    if context.group is None:
        return None
    group = RankGroup(context.group, context.rows_group)
    return None if group.size == 1 else group
