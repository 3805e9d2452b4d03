"""A model's rows never reach another model: the transformers adapter's default
identity covers the weights, so two checkpoints of one architecture never share rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from tiny_vlms import TinyVLM

from mm_schedule.integrations.transformers import (
    VisionAdapter,
    default_model_id,
    weights_fingerprint,
)


def test_two_checkpoints_of_one_config_get_different_identities():
    a, b = TinyVLM("qwen2_vl", seed=0).model, TinyVLM("qwen2_vl", seed=1).model
    assert a.config.to_json_string() == b.config.to_json_string()  # same architecture, same name
    assert VisionAdapter(a).model_id != VisionAdapter(b).model_id
    same = TinyVLM("qwen2_vl", seed=0).model
    assert VisionAdapter(same).model_id == VisionAdapter(a).model_id  # same weights: same identity
    # Items hash alike only under the same identity.
    gen = torch.Generator().manual_seed(3)
    vlm = TinyVLM("qwen2_vl", seed=0)
    inputs = vlm.prompt([3, vlm.image(gen), 2], gen)
    assert [it.hash for it in VisionAdapter(a).items(inputs)] != [it.hash for it in VisionAdapter(b).items(inputs)]


def test_a_single_changed_weight_changes_the_fingerprint():
    model = TinyVLM("llava_clip", seed=0).model
    before = weights_fingerprint(model)
    name, param = max(model.named_parameters(), key=lambda np_: np_[1].numel())
    with torch.no_grad():
        param.view(-1)[param.numel() // 2 + 1] += 1e-3  # one element, off the strided sample
    assert weights_fingerprint(model) != before
    assert default_model_id(model).endswith(f":w{weights_fingerprint(model)}")
    assert name  # the largest parameter was the one changed
