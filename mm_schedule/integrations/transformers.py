"""Hugging Face transformers vision-language models as mm_schedule items and an encoder.

``VisionAdapter(model)`` turns a processor's output into the items of a request
(``MMItem``: placeholder spans found in ``input_ids``, the item's own pixels, a content
hash) and is itself the encoder the scheduler calls: it runs the model's vision path
(``get_image_features`` / ``get_video_features``) on a batch of items, from any number
of requests, and returns one ``[rows, H]`` tensor per item::

    adapter = VisionAdapter(model, model_id="Qwen/Qwen2-VL-2B-Instruct@main")
    items = adapter.items(processor(text=..., images=...))        # once per request
    embeds = adapter.embed_text(step_input_ids)                    # every step
    merge_chunk(embeds, [RequestChunk(items, prefix, extend), ...], adapter, cache=cache)

Supported (``config.model_type``):

* ``qwen2_vl``, ``qwen2_5_vl``: pixels are flattened patch rows ``[sum t*h*w, D]`` with
  one grid ``(t, h, w)`` per image or video; an item owns its ``t*h*w`` rows and its grid
  and embeds to ``t*h*w / merge_size**2`` rows. Images and videos.
* ``llava`` (any vision tower: CLIP, SigLIP, ...), ``gemma3``: pixels ``[N, C, H, W]``,
  one image per entry, all images of a model the same number of rows.

Tested with transformers 4.57 and 5.x: 5.x returns the vision rows inside a
``BaseModelOutputWithPooling`` (``vision_rows`` reads both). Importing this module imports
torch; transformers itself is never imported (the model object is all the adapter needs).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InvalidItemError, UnsupportedModelError
from ..hashing import content_hash
from ..items import MMItem, modality_name

GRID_MODELS = ("qwen2_vl", "qwen2_5_vl")
FIXED_SIZE_MODELS = ("llava", "gemma3")


@dataclass(frozen=True)
class VisionPath:
    """One modality's way through a model: its placeholder token, where the processor
    puts its pixels (and grids), and the model method that embeds them."""

    modality: str
    token_id: int
    pixels_key: str
    grid_key: str | None
    method: str


def vision_paths(model: Any) -> tuple[VisionPath, ...]:
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind in GRID_MODELS:
        return (
            VisionPath("IMAGE", int(config.image_token_id), "pixel_values", "image_grid_thw", "get_image_features"),
            VisionPath(
                "VIDEO", int(config.video_token_id), "pixel_values_videos", "video_grid_thw", "get_video_features"
            ),
        )
    if kind in FIXED_SIZE_MODELS:
        return (VisionPath("IMAGE", int(config.image_token_id), "pixel_values", None, "get_image_features"),)
    raise UnsupportedModelError(
        f"{type(model).__name__} (model_type {kind!r}) has no vision path this adapter knows;"
        f" supported: {', '.join(GRID_MODELS + FIXED_SIZE_MODELS)}"
    )


def default_model_id(model: Any) -> str:
    """Checkpoint name (if any), a digest of the whole config and a fingerprint of the
    weights (``weights_fingerprint``): two checkpoints of one architecture (revisions,
    a fine-tune saved under the base name, models built from a config) differ in it."""
    config = model.config
    digest = hashlib.blake2b(config.to_json_string(use_diff=False).encode(), digest_size=8).hexdigest()
    name = getattr(config, "_name_or_path", "") or "unnamed"
    return f"{type(model).__name__}:{name}:{digest}:w{weights_fingerprint(model)}"


_SAMPLES_PER_PARAMETER = 64


@torch.no_grad()
def weights_fingerprint(model: Any) -> str:
    """A digest of every parameter and buffer: its name, shape, dtype, its sum (float64)
    and an evenly strided sample of its values. Computed once per adapter, with one copy
    to the host for the whole model; a change to any weight moves the sum. Parameters on
    ``meta`` (no data) contribute their names and shapes only."""
    described, summaries = [], []
    for name, t in sorted(list(model.named_parameters()) + list(model.named_buffers()), key=lambda nt: nt[0]):
        described.append(f"{name}:{tuple(t.shape)}:{t.dtype}")
        if t.is_meta or not t.numel():
            continue
        flat = t.detach().reshape(-1)
        values = flat if flat.is_floating_point() else flat.to(torch.float64)
        step = max(flat.numel() // _SAMPLES_PER_PARAMETER, 1)
        summaries.append(torch.cat([values.sum(dtype=torch.float64).reshape(1), values[::step].to(torch.float64)]))
    h = hashlib.blake2b("|".join(described).encode(), digest_size=8)
    if summaries:
        by_device: dict[Any, list[Any]] = {}
        for piece in summaries:
            by_device.setdefault(piece.device, []).append(piece)
        for pieces in by_device.values():
            h.update(torch.cat(pieces).cpu().numpy().tobytes())
    return h.hexdigest()


class VisionAdapter:
    """Items from a processor's output, and the encoder for them (see the module docstring).

    ``model``: a ``*ForConditionalGeneration`` (or its inner ``*Model``) of a supported
    type. ``model_id``: the identity hashed into every item (defaults to
    ``default_model_id``: checkpoint name, config and a fingerprint of the weights); the
    model's dtype is always added to it, since it changes the rows. A model whose
    weights change in place after the adapter is built needs a new adapter.
    """

    def __init__(self, model: Any, *, model_id: str | None = None) -> None:
        self.model = model
        self.paths = {p.modality: p for p in vision_paths(model)}
        self.model_id = f"{model_id or default_model_id(model)}|{model.dtype}"
        # 5.x returns a tuple instead of its output object under a config's return_dict=False.
        self._encode_kwargs = {"return_dict": True} if transformers_major(model) >= 5 else {}
        self.calls = 0

    # -- items -------------------------------------------------------------------------
    def items(self, inputs: Mapping[str, Any]) -> list[MMItem]:
        """Items of one request; ``inputs["input_ids"]`` is ``[L]`` or ``[1, L]``."""
        ids = _tensor(inputs, "input_ids")
        if ids.dim() == 2 and ids.shape[0] != 1:
            raise InvalidItemError(
                f"input_ids hold {ids.shape[0]} sequences; use batch_items for a batched processor output"
            )
        return self.batch_items(inputs)[0]

    def batch_items(self, inputs: Mapping[str, Any]) -> list[list[MMItem]]:
        """Items of each row of ``inputs["input_ids"]`` (``[B, L]``), sorted by position.
        Offsets are positions in that row, padding included. Tensors, NumPy arrays
        (``return_tensors="np"``) and nested lists are all accepted."""
        ids = _tensor(inputs, "input_ids")
        rows_ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
        per_row: list[list[MMItem]] = [[] for _ in range(rows_ids.shape[0])]
        for path in self.paths.values():
            for row, item in self._path_items(path, inputs, rows_ids):
                per_row[row].append(item)
        for items in per_row:
            items.sort(key=lambda it: it.offsets[0][0])
        return per_row

    def _path_items(self, path: VisionPath, inputs: Mapping[str, Any], ids: Any) -> list[tuple[int, MMItem]]:
        pixels = _tensor(inputs, path.pixels_key)
        n_tokens = int((ids == path.token_id).sum())
        if pixels is None:
            if n_tokens:
                raise InvalidItemError(
                    f"input_ids hold {n_tokens} {path.modality.lower()} placeholder tokens"
                    f" (id {path.token_id}) but the inputs have no {path.pixels_key}"
                )
            return []
        grid_thw = _tensor(inputs, path.grid_key) if path.grid_key else None
        features, grids, rows = self._split(path, pixels, grid_thw, n_tokens)
        spans = place_items(ids, path.token_id, rows, what=path.modality.lower())
        out = []
        for (row, span), feature, grid in zip(spans, features, grids):
            item = MMItem(
                modality=path.modality,
                hash=content_hash(feature, model=self.model_id, modality=path.modality, grid=grid),
                offsets=[span],
                feature=feature,
                pad_value=path.token_id,
            )
            if grid is not None:
                item.model_specific_data["grid_thw"] = grid
            out.append((row, item))
        return out

    def _split(self, path: VisionPath, pixels: Any, grid_thw: Any, n_tokens: int) -> tuple[list, list, list[int]]:
        """Per item: its pixels, its grid (or None) and the rows it embeds to."""
        if path.grid_key is not None:
            if grid_thw is None:
                raise InvalidItemError(
                    f"{path.pixels_key} are flattened patch rows; the inputs need {path.grid_key} to split them"
                )
            grid_thw = grid_thw.reshape(-1, 3)
            patches = grid_thw.prod(-1).tolist()
            if sum(patches) != pixels.shape[0]:
                raise InvalidItemError(
                    f"{path.grid_key} describes {sum(patches)} patch rows, {path.pixels_key} has {pixels.shape[0]}"
                )
            merge = int(self.model.config.vision_config.spatial_merge_size)
            for grid in grid_thw.tolist():
                if grid[1] % merge or grid[2] % merge:
                    raise InvalidItemError(
                        f"{path.grid_key} row {grid}: height and width must be multiples of the merge size {merge}"
                    )
            features = list(pixels.split(patches))
            return features, list(grid_thw.to("cpu")), [p // merge**2 for p in patches]
        if pixels.dim() != 4:
            raise InvalidItemError(
                f"{path.pixels_key} must be [images, channels, height, width], got {tuple(pixels.shape)}"
            )
        n_images = pixels.shape[0]
        if n_images == 0 or n_tokens % n_images:
            raise InvalidItemError(
                f"{n_tokens} {path.modality.lower()} placeholder tokens (id {path.token_id}) cannot be split"
                f" evenly among {n_images} images"
            )
        return list(pixels.unbind(0)), [None] * n_images, [n_tokens // n_images] * n_images

    # -- encoder -----------------------------------------------------------------------
    def __call__(self, items: Sequence[Any]) -> list[Any]:
        """The scheduler's encoder: one vision forward for all ``items`` (one modality)."""
        modality = modality_name(items[0].modality)
        path = self.paths.get(modality)
        if path is None or any(modality_name(it.modality) != modality for it in items):
            raise InvalidItemError(
                f"{type(self.model).__name__} embeds {sorted(self.paths)}, got items of"
                f" {sorted({modality_name(it.modality) for it in items})} in one call"
            )
        encode = getattr(self.model, path.method)
        device = self.model.device
        with torch.no_grad():
            if path.grid_key is not None:
                pixels = torch.cat([it.feature for it in items]).to(device)
                grids = torch.stack([_item_grid(it) for it in items]).to(device)
                output = encode(pixels, grids, **self._encode_kwargs)
            else:
                output = encode(torch.stack([it.feature for it in items]).to(device), **self._encode_kwargs)
        self.calls += 1
        return list(vision_rows(output, f"{type(self.model).__name__}.{path.method}"))

    # -- text --------------------------------------------------------------------------
    def embed_text(self, input_ids: Any) -> Any:
        """The model's text embeddings of ``input_ids`` (placeholder rows included, to
        be overwritten by ``merge_chunk``). Placeholder ids outside the vocabulary
        (Gemma 3's) are looked up as id 0, as the model itself does."""
        table = self.model.get_input_embeddings()
        placeholders = torch.tensor([p.token_id for p in self.paths.values()], device=input_ids.device)
        oov = torch.isin(input_ids, placeholders) & (input_ids >= table.num_embeddings)
        with torch.no_grad():
            return table(torch.where(oov, torch.zeros_like(input_ids), input_ids))


def transformers_major(model: Any) -> int:
    """The major version of the transformers that defined ``model``'s class (0 for a class
    from elsewhere), read from the already imported package."""
    package = sys.modules.get(type(model).__module__.partition(".")[0])
    if package is None or package.__name__ != "transformers":
        return 0
    return int(package.__version__.split(".")[0])


def vision_rows(output: Any, method: str) -> Any:
    """The per-item rows in what ``get_image_features`` / ``get_video_features`` returned:
    transformers 4.x returns the rows themselves (a tensor ``[items, rows, H]`` or a
    sequence of ``[rows, H]``), 5.x a ``BaseModelOutputWithPooling`` holding them in
    ``pooler_output`` (iterating it would give its field names)."""
    if isinstance(output, torch.Tensor) or (
        isinstance(output, (list, tuple)) and all(isinstance(rows, torch.Tensor) for rows in output)
    ):
        return output
    rows = getattr(output, "pooler_output", None)
    if rows is None:
        raise UnsupportedModelError(
            f"{method} returned a {type(output).__name__} that holds no rows: expected the rows"
            " (transformers 4.x) or an output with pooler_output (5.x)"
        )
    return rows


def _tensor(inputs: Mapping[str, Any], key: str) -> Any:
    """``inputs[key]`` as a torch tensor (None when absent); NumPy arrays are shared, not copied."""
    if key == "input_ids" and key not in inputs:
        raise InvalidItemError("the inputs have no input_ids")
    value = inputs.get(key)
    return None if value is None else torch.as_tensor(value)


def _item_grid(item: Any) -> Any:
    grid = item.model_specific_data.get("grid_thw") if hasattr(item, "model_specific_data") else None
    if grid is None:
        raise InvalidItemError(f"item hash {item.hash}: flattened patch rows without a grid_thw")
    return grid


def place_items(ids: Any, token_id: int, rows: Sequence[int], *, what: str) -> list[tuple[int, tuple[int, int]]]:
    """Walk the runs of ``token_id`` in ``ids`` (``[B, L]``, row by row) and give each
    item, in order, its ``rows[k]`` consecutive positions; adjacent items may share a
    run, no item may straddle two. Returns ``(row, (start, end))`` per item, end inclusive."""
    out: list[tuple[int, tuple[int, int]]] = []
    k = 0
    for row in range(ids.shape[0]):
        for start, length in _runs(ids[row], token_id):
            pos, end = start, start + length
            while pos < end:
                if k == len(rows):
                    raise InvalidItemError(
                        f"row {row}: {what} placeholder tokens at {pos}..{end - 1} but all {len(rows)} {what}s"
                        " of the inputs are already placed"
                    )
                if pos + rows[k] > end:
                    raise InvalidItemError(
                        f"row {row}: {what} {k} needs {rows[k]} placeholder tokens, the run at {start}"
                        f" has {end - pos} left"
                    )
                out.append((row, (pos, pos + rows[k] - 1)))
                pos += rows[k]
                k += 1
    if k != len(rows):
        raise InvalidItemError(
            f"the inputs hold {len(rows)} {what}s, input_ids have placeholder tokens for {k}"
        )
    return out


def _runs(ids: Any, token_id: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each maximal run of ``token_id`` in a 1-D tensor."""
    positions = (ids == token_id).nonzero().flatten().tolist()
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs
