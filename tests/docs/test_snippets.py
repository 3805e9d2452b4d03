"""The Python snippets of README.md and docs/*.md run as written.

A snippet is run when the line before its fence is ``<!-- test-setup: NAME -->``;
NAME picks the variables it is given (``none``: nothing) and, for some, what is
checked about the result afterwards.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = re.compile(r"^<!-- test-setup: (\S+) -->\n```python\n(.*?)^```$", re.M | re.S)
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def snippets() -> list:
    found = []
    for path in DOCUMENTS:
        for i, match in enumerate(SNIPPET.finditer(path.read_text())):
            found.append(pytest.param(match.group(1), match.group(2), id=f"{path.relative_to(ROOT)}#{i}"))
    return found


def _examples(*names: str) -> list:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import tiny_vlms
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return [getattr(tiny_vlms, name) for name in names]


def setup_qwen2_vl_two_prompts() -> dict:
    """A tiny Qwen2-VL and two prompts whose images straddle token 32 (62 and 57 tokens)."""
    (tiny_vlm,) = _examples("TinyVLM")
    vlm = tiny_vlm("qwen2_vl")
    gen = torch.Generator().manual_seed(21)
    a = vlm.prompt([20, vlm.image(gen, (1, 8, 8)), 24], gen)  # image tokens 21..36
    b = vlm.prompt([10, vlm.image(gen, (1, 8, 12)), 21], gen)  # image tokens 11..34
    assert (a["input_ids"].shape[1], b["input_ids"].shape[1]) == (62, 57)
    return {"model": vlm.model, "processed": {"a": a, "b": b}, "_vlm": vlm}


def check_qwen2_vl_two_prompts(ns: dict) -> None:
    (reorder_tolerance,) = _examples("reorder_tolerance")
    vlm, cache = ns["_vlm"], ns["cache"]
    assert ns["adapter"].calls == 1  # both images in step 1's single call
    stats = cache.stats()
    assert (stats.insertions, stats.hits) == (2, 2)
    a1, b1 = ns["step1"].split([32, 32])
    a2, b2 = ns["step2"].split([30, 25])
    for rid, got in (("a", torch.cat([a1, a2])), ("b", torch.cat([b1, b2]))):
        inputs = ns["processed"][rid]
        (item,) = ns["items"][rid]
        # Assembly copies what the encoder returned (the cache holds those rows): exact.
        encoded = cache.lookup(item.hash)
        assert torch.equal(got, vlm.merge_rows(inputs, {"IMAGE": encoded})[0])
        # The model's own forward encodes this image alone, step 1 encoded both together:
        # the same rows to the rounding of a matrix product over another number of rows.
        own = vlm.reference_embeds(inputs)[0]
        torch.testing.assert_close(got, own, rtol=0, atol=reorder_tolerance(vlm.vision, own))


SETUPS = {"none": dict, "qwen2_vl_two_prompts": setup_qwen2_vl_two_prompts}
CHECKS = {"qwen2_vl_two_prompts": check_qwen2_vl_two_prompts}


def test_readme_shows_the_three_ways_in():
    names = [p.values[0] for p in snippets() if p.id.startswith("README.md")]
    assert len(names) >= 3 and "qwen2_vl_two_prompts" in names


def test_the_transformers_glue_is_at_most_ten_lines():
    readme = (ROOT / "README.md").read_text()
    code = next(m.group(2) for m in SNIPPET.finditer(readme) if m.group(1) == "qwen2_vl_two_prompts")
    glue = [
        line for line in code.splitlines()
        if line.strip() and not line.startswith(("import ", "from ", "#", "step1", "step2"))
    ]
    assert len(glue) <= 10, glue


@pytest.mark.parametrize("setup, code", snippets())
def test_snippet_runs(setup, code):
    assert setup in SETUPS, f"unknown test-setup {setup!r}"
    namespace = SETUPS[setup]()
    exec(compile(code, f"<snippet {setup}>", "exec"), namespace)
    if setup in CHECKS:
        CHECKS[setup](namespace)
