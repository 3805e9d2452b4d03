"""Tiny random-weight vision-language models from transformers, and processor-like inputs.

The architectures are the real ones (Qwen2-VL, Qwen2.5-VL, LLaVA with a CLIP or a
SigLIP tower, Gemma 3), built from configs with a few narrow layers: nothing is
downloaded. ``TinyVLM.prompt`` lays out what the model's processor would return for a
prompt: ``input_ids`` with the model's placeholder runs (and its begin/end-of-image
tokens), pixels in the model's layout (flattened patch rows plus a ``(t, h, w)`` grid
per image for Qwen, ``[N, 3, S, S]`` for the others), and the token types the installed
transformers' processor adds (Gemma 3's ``token_type_ids``; Qwen's ``mm_token_type_ids``
from 5.x on, which its forward and ``get_rope_index`` then need).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mm_schedule.integrations.transformers import transformers_major, vision_rows
from mm_schedule.tolerance import (
    reorder_tolerance,  # noqa: F401  (the demo and tests read it from here)
)

VOCAB = 128
TEXT_IDS = 100  # ordinary text tokens are drawn below this; model-specific tokens sit above
IMAGE_ID, VIDEO_ID, BEGIN_ID, END_ID = 120, 121, 122, 123
BOS_ID, EOS_ID = 124, 125  # inside the tiny vocabulary (Qwen's defaults are not; 5.x warns)
HIDDEN = 32
PATCH = 4
IMAGE_PX = 16  # LLaVA and Gemma 3 images: 16 x 16 px, 4 x 4 patches
QWEN_MERGE, QWEN_TEMPORAL = 2, 2
KINDS = ("qwen2_vl", "qwen2_5_vl", "llava_clip", "llava_siglip", "gemma3")
# (modality, processor key of its pixels, of its grids, the model method that embeds them)
VISION_INPUTS = (
    ("IMAGE", "pixel_values", "image_grid_thw", "get_image_features"),
    ("VIDEO", "pixel_values_videos", "video_grid_thw", "get_video_features"),
)


def _text(**extra: Any) -> dict:
    return dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=BOS_ID, eos_token_id=EOS_ID, **extra,
    )


def build_model(kind: str, *, seed: int = 0) -> Any:
    """A tiny ``*ForConditionalGeneration`` of ``kind`` (one of ``KINDS``) in eval mode."""
    import transformers as tf

    torch.manual_seed(seed)
    mrope = {"type": "mrope", "mrope_section": [2, 1, 1]}
    qwen_ids = dict(image_token_id=IMAGE_ID, video_token_id=VIDEO_ID, vision_start_token_id=BEGIN_ID,
                    vision_end_token_id=END_ID)
    small_tower = dict(hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       image_size=IMAGE_PX, patch_size=PATCH)
    if kind == "qwen2_vl":
        config = tf.Qwen2VLConfig(
            text_config=_text(rope_scaling=mrope),
            vision_config=dict(depth=2, embed_dim=HIDDEN, hidden_size=HIDDEN, num_heads=4, mlp_ratio=2,
                               patch_size=PATCH, spatial_merge_size=QWEN_MERGE, temporal_patch_size=QWEN_TEMPORAL),
            **qwen_ids,
        )
        model = tf.Qwen2VLForConditionalGeneration(config)
    elif kind == "qwen2_5_vl":
        config = tf.Qwen2_5_VLConfig(
            text_config=_text(rope_scaling=mrope),
            vision_config=dict(depth=2, hidden_size=HIDDEN, intermediate_size=64, num_heads=4, out_hidden_size=HIDDEN,
                               patch_size=PATCH, spatial_merge_size=QWEN_MERGE, temporal_patch_size=QWEN_TEMPORAL,
                               window_size=16, fullatt_block_indexes=[1]),
            **qwen_ids,
        )
        model = tf.Qwen2_5_VLForConditionalGeneration(config)
    elif kind in ("llava_clip", "llava_siglip"):
        clip = kind == "llava_clip"
        tower = tf.CLIPVisionConfig(**small_tower) if clip else tf.SiglipVisionConfig(**small_tower)
        config = tf.LlavaConfig(
            vision_config=tower, text_config=tf.LlamaConfig(**_text()), image_token_index=IMAGE_ID,
            vision_feature_layer=-2,
            # CLIP's first output is its class token, which LLaVA drops ("default");
            # SigLIP has none, so every patch is kept ("full").
            vision_feature_select_strategy="default" if clip else "full",
        )
        model = tf.LlavaForConditionalGeneration(config)
    elif kind == "gemma3":
        config = tf.Gemma3Config(
            text_config=_text(head_dim=8, sliding_window=16),
            vision_config=dict(small_tower, num_hidden_layers=1),
            mm_tokens_per_image=4, image_token_index=IMAGE_ID, boi_token_index=BEGIN_ID, eoi_token_index=END_ID,
        )
        model = tf.Gemma3ForConditionalGeneration(config)
        # Gemma 3 initialises its image projection to zeros, so every image would embed
        # to zero rows and no test could tell one image's rows from another's.
        torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.1)
    else:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    return model.eval()


@dataclass(frozen=True)
class Image:
    """Pixels of one image (or video) in the model's layout, and its placeholder count."""

    pixels: torch.Tensor
    tokens: int
    grid: tuple[int, int, int] | None = None
    video: bool = False


class TinyVLM:
    def __init__(self, kind: str, *, seed: int = 0) -> None:
        self.kind = kind
        self.model = build_model(kind, seed=seed)
        self.qwen = kind.startswith("qwen")
        self.transformers_major = transformers_major(self.model)

    def tokens_per_image(self) -> int:
        if self.kind == "gemma3":
            return self.model.config.mm_tokens_per_image
        return (IMAGE_PX // PATCH) ** 2

    def image(self, gen: torch.Generator, grid: tuple[int, int, int] = (1, 4, 4), *, video: bool = False) -> Image:
        """Random pixels; ``grid`` (patches, Qwen only) must have h and w even."""
        if not self.qwen:
            return Image(torch.randn(3, IMAGE_PX, IMAGE_PX, generator=gen), self.tokens_per_image())
        t, h, w = grid
        rows = torch.randn(t * h * w, 3 * QWEN_TEMPORAL * PATCH * PATCH, generator=gen)
        return Image(rows, t * h * w // QWEN_MERGE**2, grid, video)

    def prompt(self, parts: Sequence[int | Image], gen: torch.Generator) -> dict[str, torch.Tensor]:
        """A processor's output for one request: ``int`` parts are runs of random text
        tokens, ``Image`` parts become begin / placeholders / end (Qwen, Gemma 3) or a
        bare placeholder run (LLaVA)."""
        ids: list[int] = []
        images = [p for p in parts if isinstance(p, Image)]
        for part in parts:
            if isinstance(part, int):
                ids += torch.randint(0, TEXT_IDS, (part,), generator=gen).tolist()
                continue
            wrap = self.kind != "llava_clip" and self.kind != "llava_siglip"
            ids += ([BEGIN_ID] if wrap else []) + [VIDEO_ID if part.video else IMAGE_ID] * part.tokens
            ids += [END_ID] if wrap else []
        out = {"input_ids": torch.tensor([ids])}
        types = self._token_types(out["input_ids"])
        if types is not None:
            out["mm_token_type_ids" if self.qwen else "token_type_ids"] = types
        stills = [im for im in images if not im.video]
        videos = [im for im in images if im.video]
        if self.qwen:
            if stills:
                out["pixel_values"] = torch.cat([im.pixels for im in stills])
                out["image_grid_thw"] = torch.tensor([im.grid for im in stills])
            if videos:
                out["pixel_values_videos"] = torch.cat([im.pixels for im in videos])
                out["video_grid_thw"] = torch.tensor([im.grid for im in videos])
        elif stills:
            out["pixel_values"] = torch.stack([im.pixels for im in stills])
        return out

    def _token_types(self, ids: torch.Tensor) -> torch.Tensor | None:
        """0 for text, 1 for image and 2 for video placeholders, where the processor adds them."""
        if self.kind == "gemma3" or (self.qwen and self.transformers_major >= 5):
            return (ids == IMAGE_ID).long() + 2 * (ids == VIDEO_ID).long()
        return None

    @property
    def vision(self) -> tuple[torch.nn.Module, ...]:
        """The modules that turn pixels into rows: vision tower and projector."""
        inner = self.model.model
        return (inner.visual,) if self.qwen else (inner.vision_tower, inner.multi_modal_projector)

    def own_rows(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The model's own vision rows for one request, per modality, in prompt order:
        every image of the request in one call, as its forward encodes them."""
        rows = {}
        with torch.no_grad():
            for modality, pixels_key, grid_key, method in VISION_INPUTS:
                if pixels_key not in inputs:
                    continue
                encode = getattr(self.model, method)
                out = encode(inputs[pixels_key], inputs[grid_key]) if self.qwen else encode(inputs[pixels_key])
                feats = vision_rows(out, method)
                rows[modality] = torch.cat(list(feats)) if isinstance(feats, (list, tuple)) else feats.reshape(-1, HIDDEN)
        return rows

    def merge_rows(self, inputs: Mapping[str, torch.Tensor], rows: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The model's merge: its text embeddings with ``rows`` (per modality, in prompt
        order) scattered into the placeholder rows, as its forward does before the decoder."""
        model = self.model
        ids = inputs["input_ids"]
        with torch.no_grad():
            text_ids = torch.where(ids >= model.get_input_embeddings().num_embeddings, 0, ids)
            embeds = model.get_input_embeddings()(text_ids)
            for modality, token in (("IMAGE", IMAGE_ID), ("VIDEO", VIDEO_ID)):
                if modality in rows:
                    mask = (ids == token).unsqueeze(-1).expand_as(embeds)
                    embeds = embeds.masked_scatter(mask, rows[modality].to(embeds.dtype))
        return embeds

    def reference_embeds(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The model's own merge of its own per-request vision rows."""
        return self.merge_rows(inputs, self.own_rows(inputs))

    def forward_kwargs(self, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
        """What the decoder needs besides ``inputs_embeds`` to match the model's own forward
        on ``inputs``: Qwen's M-RoPE positions depend on the whole prompt's grids (5.x reads
        the placeholders from ``mm_token_type_ids``, 4.x from ``input_ids``); Gemma 3's
        image tokens attend to each other both ways by ``token_type_ids``."""
        if self.kind == "gemma3":
            return {"token_type_ids": inputs["token_type_ids"]}
        if not self.qwen:
            return {}
        grids = inputs.get("image_grid_thw"), inputs.get("video_grid_thw")
        rope_index = self.model.model.get_rope_index
        if "mm_token_type_ids" in inputs:
            positions, _ = rope_index(inputs["input_ids"], inputs["mm_token_type_ids"], *grids)
        else:
            positions, _ = rope_index(inputs["input_ids"], *grids, None)
        return {"position_ids": positions}
