"""A real vision-encoder architecture with random weights, for benchmarks and the demo.

The tower is SigLIP so400m-patch14-384 (the vision tower of LLaVA-OneVision), built by
``transformers`` from its config numbers: nothing is downloaded, the weights are random
with a fixed seed. A two-layer GELU MLP projects its 1152-wide patch features to the
language model's hidden size (LLaVA's ``mlp2x_gelu``); 896 is the hidden size of
Qwen2-0.5B, the language model of llava-onevision-qwen2-0.5b.

``VisionEncoder`` is a scheduler encoder: it takes a list of items and returns their
rows. An item's ``feature`` is pixels: ``[3, S, S]`` for an image (``S*S/14**2`` rows)
or ``[F, 3, S, S]`` for a video (one image's rows per frame, frames in order). All
items of one call go through the tower as one batch, so one call per step really is
one forward pass.

Shapes:

* ``SO400M``: the real thing, 27 layers at 384 px (729 rows per image). Far too slow
  for two CPU cores; meant for a GPU.
* ``small_shape()``: the same width, heads and patch size, 2 of the 27 layers, 112 px
  images (64 rows per image). Per layer and per token it costs what the real model
  costs; it just has fewer of both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from mm_schedule.tolerance import reorder_tolerance

LM_HIDDEN_QWEN2_0_5B = 896


@dataclass(frozen=True)
class EncoderShape:
    name: str
    num_layers: int
    image_size: int
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    patch_size: int = 14
    lm_hidden: int = LM_HIDDEN_QWEN2_0_5B

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def describe(self) -> str:
        return (
            f"{self.name}: SigLIP width {self.hidden_size}, MLP {self.intermediate_size}, "
            f"{self.num_heads} heads, patch {self.patch_size}, {self.num_layers} layers, "
            f"{self.image_size} px ({self.tokens_per_image} rows per image), "
            f"projector {self.hidden_size}->{self.lm_hidden}->{self.lm_hidden}"
        )


SO400M = EncoderShape("siglip-so400m-patch14-384", num_layers=27, image_size=384)


def small_shape(*, num_layers: int = 2, image_size: int = 112) -> EncoderShape:
    if image_size % SO400M.patch_size:
        raise ValueError(f"image_size {image_size} is not a multiple of the patch size {SO400M.patch_size}")
    return replace(
        SO400M,
        name=f"siglip-so400m-patch14 ({num_layers} of 27 layers, {image_size} px)",
        num_layers=num_layers,
        image_size=image_size,
    )


class VisionEncoder:
    """SigLIP tower + projector, callable as ``encoder(items) -> [sum rows, lm_hidden]``.

    ``per_item=True`` returns one tensor per item instead of one combined tensor (the
    other output form SGLang's ``DataEmbeddingFunc`` allows). ``calls`` and
    ``items_seen`` count what the scheduler asked for.
    """

    def __init__(
        self,
        shape: EncoderShape,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        per_item: bool = False,
    ) -> None:
        from transformers import SiglipVisionConfig, SiglipVisionModel

        self.shape = shape
        self.per_item = per_item
        self.device = torch.device(device)
        self.dtype = dtype
        config = SiglipVisionConfig(
            hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size,
            num_hidden_layers=shape.num_layers,
            num_attention_heads=shape.num_heads,
            image_size=shape.image_size,
            patch_size=shape.patch_size,
            vision_use_head=False,  # LLaVA-style models read patch features, not the pooled head
            attn_implementation="sdpa",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tower = SiglipVisionModel(config).eval()
            self.projector = torch.nn.Sequential(
                torch.nn.Linear(shape.hidden_size, shape.lm_hidden),
                torch.nn.GELU(),
                torch.nn.Linear(shape.lm_hidden, shape.lm_hidden),
            ).eval()
        self.tower.to(device=self.device, dtype=dtype)
        self.projector.to(device=self.device, dtype=dtype)
        self.calls = 0
        self.items_seen = 0

    def reorder_tolerance(self, want: torch.Tensor) -> float:
        """How far ``want`` may move when only the order of this encoder's sums changes
        (another batch composition, thread count or SIMD path)."""
        return reorder_tolerance([self.tower, self.projector], want)

    # -- inputs ----------------------------------------------------------------------

    def random_image(self, generator: torch.Generator) -> torch.Tensor:
        s = self.shape.image_size
        return torch.rand(3, s, s, generator=generator, dtype=self.dtype) * 2 - 1

    def random_video(self, frames: int, generator: torch.Generator) -> torch.Tensor:
        s = self.shape.image_size
        return torch.rand(frames, 3, s, s, generator=generator, dtype=self.dtype) * 2 - 1

    def rows_for(self, pixels: torch.Tensor) -> int:
        return self._frames(pixels).shape[0] * self.shape.tokens_per_image

    def _frames(self, pixels: Any, index: int = 0) -> torch.Tensor:
        s = self.shape.image_size
        if not isinstance(pixels, torch.Tensor):
            raise TypeError(f"item {index}: feature must be a pixel tensor, got {type(pixels).__name__}")
        frames = pixels.unsqueeze(0) if pixels.dim() == 3 else pixels
        if frames.dim() != 4 or tuple(frames.shape[1:]) != (3, s, s):
            raise ValueError(
                f"item {index}: feature of shape {tuple(pixels.shape)} is neither an image [3, {s}, {s}]"
                f" nor a video [frames, 3, {s}, {s}]"
            )
        return frames

    # -- the encoder -----------------------------------------------------------------

    def __call__(self, items: Sequence[Any]) -> torch.Tensor | list[torch.Tensor]:
        return self.encode(items, per_item=self.per_item)

    def encode(self, items: Sequence[Any], *, per_item: bool) -> torch.Tensor | list[torch.Tensor]:
        frames = [self._frames(item.feature, i) for i, item in enumerate(items)]
        self.calls += 1
        self.items_seen += len(items)
        pixels = torch.cat(frames).to(device=self.device, dtype=self.dtype)
        with torch.no_grad():
            patches = self.tower(pixel_values=pixels).last_hidden_state  # [frames, T, width]
            rows = self.projector(patches).reshape(-1, self.shape.lm_hidden)
        if not per_item:
            return rows
        sizes = [f.shape[0] * self.shape.tokens_per_image for f in frames]
        return [piece.clone() for piece in rows.split(sizes)]
