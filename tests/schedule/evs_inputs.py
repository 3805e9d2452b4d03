"""EVS test inputs shared by the single-process tests and the ranks' scenarios (which
spawned processes import by module name): prompts with videos, an EVS encoder, and a
naive reference written from the semantics: walk the prompt frame by frame, resize each
frame's placeholder run to the tokens the encoder kept, number the placeholder
positions, and read a window off that."""

from __future__ import annotations

import random

import torch

from mm_schedule import MMItem
from mm_schedule.evs import PRE_CHUNKED_KEY, EVSEmbeddingResult

try:  # as tests.schedule.evs_inputs, or by name in a spawned rank process
    from .helpers import truth
except ImportError:
    from helpers import truth

HIDDEN = 8
VOCAB = 1000


# -- inputs -------------------------------------------------------------------------------


class Prompt:
    """One request's prompt: text, a video of ``frames`` placeholder runs separated by
    text (the processor's even split, the last frame taking the remainder), text. With
    ``evs`` the encoder prunes it; ``frames=0`` is a request with no video."""

    def __init__(self, rng: random.Random, h: int, *, frames: int = 3, evs: bool = True, separator: int = 2):
        self.ids: list[int] = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 6))]
        self.pad = 1_000_000 + h
        per_frame = rng.randint(2, 6)
        spans = []
        for f in range(frames):
            start = len(self.ids)
            n = per_frame + (rng.randint(0, 3) if f == frames - 1 else 0)
            self.ids += [self.pad] * n
            spans.append((start, start + n - 1))
            if f < frames - 1:
                self.ids += [rng.randrange(VOCAB) for _ in range(separator)]
        self.ids += [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
        total = sum(e - s + 1 for s, e in spans)
        if evs:  # what the encoder keeps per frame: any split of the same total, zeros allowed
            cuts = sorted(rng.randint(0, total) for _ in range(frames - 1))
            self.kept = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
        else:
            self.kept = [e - s + 1 for s, e in spans]
        data = {PRE_CHUNKED_KEY: list(self.ids)} if evs else {}
        self.video = None if not frames else MMItem(
            modality="VIDEO", hash=h, offsets=spans, pad_value=self.pad, model_specific_data=data,
        )
        self.evs = evs
        self.rows = truth(h, total, HIDDEN)


class EVSEncoder:
    """Pruned rows and frame counts for an EVS video (alone in its call), the full rows
    (one tensor per item) for any other video."""

    def __init__(self, prompts: list[Prompt], result_type=EVSEmbeddingResult):
        self.by_hash = {p.video.hash: p for p in prompts if p.video is not None}
        self.result_type = result_type
        self.calls: list[list[int]] = []

    def __call__(self, items):
        self.calls.append([it.hash for it in items])
        prompts = [self.by_hash[it.hash] for it in items]
        if any(p.evs for p in prompts):
            assert len(items) == 1, "an EVS encoder takes one video per call"
            return self.result_type(embedding=prompts[0].rows.clone(), num_tokens_per_frame=list(prompts[0].kept))
        return [p.rows.clone() for p in prompts]


def naive_step(prompts: list[Prompt], windows: list[tuple[int, int]]):
    """Rows, mask and input_ids of one step, computed position by position."""
    ids_out, rows_out, mask_out = [], [], []
    for p, (prefix, extend) in zip(prompts, windows):
        new_ids, row_at = [], {}
        position, frame, row = 0, 0, 0
        spans = p.video.offsets if p.video is not None else []
        while position < len(p.ids):
            if frame < len(spans) and position == spans[frame][0]:
                for _ in range(p.kept[frame]):
                    row_at[len(new_ids)] = p.rows[row]
                    new_ids.append(p.pad)
                    row += 1
                position = spans[frame][1] + 1
                frame += 1
                continue
            new_ids.append(p.ids[position])
            position += 1
        for q in range(prefix, prefix + extend):
            ids_out.append(new_ids[q])
            mask_out.append(q in row_at)
            if q in row_at:
                rows_out.append(row_at[q])
    rows = torch.stack(rows_out) if rows_out else None
    return rows, torch.tensor(mask_out, dtype=torch.bool).unsqueeze(-1), torch.tensor(ids_out, dtype=torch.int64)


def layout(prompts: list[Prompt], windows: list[tuple[int, int]]):
    """SGLang's per-modality call for VIDEO: the batch's video items and layout."""
    items, items_size, offsets, ids = [], [0], [], []
    for p, (prefix, extend) in zip(prompts, windows):
        if p.video is not None:
            items.append(p.video)
        items_size.append(len(items))
        offsets.append(list(p.video.offsets) if p.video is not None else [])
        ids += p.ids[prefix : prefix + extend]
    placeholders = torch.tensor([it.pad_value for it in items])
    return items, placeholders, torch.tensor(ids), items_size, [w[0] for w in windows], [w[1] for w in windows], offsets
