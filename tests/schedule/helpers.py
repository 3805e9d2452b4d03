"""Shared test helpers for the scheduler: a deterministic fake encoder and a naive reference."""

from __future__ import annotations

import torch

from mm_schedule import MMItem

HIDDEN = 8


def truth(item_hash: int, rows: int, hidden: int = HIDDEN, dtype=torch.float32) -> torch.Tensor:
    """The embedding an encoder 'should' produce for an item: a function of its hash and length."""
    g = torch.Generator().manual_seed((item_hash * 7919 + rows) % (2**63))
    return torch.randn(rows, hidden, generator=g).to(dtype)


def item_rows(item) -> int:
    return sum(e - s + 1 for s, e in item.offsets)


class CountingEncoder:
    """Encoder returning ``truth`` rows, as one combined tensor or a list; records every call."""

    def __init__(self, as_list: bool = False, hidden: int = HIDDEN):
        self.as_list = as_list
        self.hidden = hidden
        self.calls: list[list[int]] = []

    def __call__(self, items):
        self.calls.append([it.hash for it in items])
        outs = [truth(it.hash, item_rows(it), self.hidden) for it in items]
        return outs if self.as_list else torch.cat(outs)

    @property
    def items_encoded(self) -> int:
        return sum(len(c) for c in self.calls)


def naive_reference(requests, hidden: int = HIDDEN) -> torch.Tensor:
    """Deliberately simple: encode each request's items alone, map every placeholder
    position to its row, keep the positions inside the window, concatenate."""
    rows = []
    for req in requests:
        position_to_row = {}
        for item in req.items:
            emb = truth(item.hash, item_rows(item), hidden)
            local = 0
            for s, e in item.offsets:
                for p in range(s, e + 1):
                    position_to_row[p] = emb[local]
                    local += 1
        for p in range(req.prefix, req.prefix + max(req.extend, 0)):
            if p in position_to_row:
                rows.append(position_to_row[p])
    return torch.stack(rows) if rows else torch.empty(0, hidden)


def image(h: int, start: int, length: int, modality="IMAGE") -> MMItem:
    return MMItem(modality=modality, hash=h, offsets=[(start, start + length - 1)], feature=torch.zeros(1))
