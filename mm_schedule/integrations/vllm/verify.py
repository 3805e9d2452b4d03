"""This integration against vLLM's own gather and merge, on the same random steps.

Each case is one step of several requests, drawn fresh from a seed: chunked prefill
windows that cut images, ``is_embed`` masks inside placeholder ranges (runs of text
positions among the embedding ones, as Qwen-VL and Pixtral processors make), items
shared by several requests (one ``mm_hash``, one cached tensor), decode requests beside
prefill ones, and bf16 and fp32. vLLM's code runs on CPU: ``EncoderRunner.
gather_mm_embeddings`` (model runner v2) and ``GPUModelRunner._gather_mm_embeddings``
(v1) where the release has them, then ``_merge_multimodal_embeddings``. Ours runs on the
same objects (vLLM's own ``PlaceholderRange`` and ``MultiModalFeatureSpec``): the packed
gather, the mask, the drop-in merge and the fused ``merge_into``, each compared bit for
bit (these are copies); the destinations are poisoned with NaN first where every row
gets written.

Against the installed vLLM (needs torch and vLLM importable; vLLM's GPU runner modules
import without a GPU)::

    python -m mm_schedule.integrations.vllm.verify [--cases 200] [--seed 0]

exits 0 when every case matches, 1, listing the differences, when one does not, and 2,
with one line saying why, when there is no vLLM (or torch) to compare with. The same
cases, fewer of them, are the probe that verifies an unlisted release on first use
(``releases.verify_release``).
"""

from __future__ import annotations

import argparse
import random
import sys
import types
from dataclasses import dataclass, field
from typing import Any

try:
    import torch
except ImportError:  # the command-line check says so in one line; nothing else runs without it
    torch = None

if torch is not None:
    from . import gather as ours_gather
    from . import merge as ours_merge


@dataclass
class VllmCode:
    """The vLLM names a comparison runs: its structures and its functions."""

    version: str
    PlaceholderRange: Any
    MultiModalFeatureSpec: Any
    merge: Any  # _merge_multimodal_embeddings
    encoder_runner: Any = None  # the EncoderRunner class (model runner v2), when present
    gpu_model_runner: Any = None  # the GPUModelRunner class (v1), when present
    public_merge: Any = None  # merge_multimodal_embeddings, in the releases that have it
    # get_mm_embedding_modalities (vllm.multimodal.utils), in the releases whose gathers tag
    # each item with its modality for the models that merge by modality
    modalities: Any = None


def from_modules(version: str, modules: dict[str, Any]) -> VllmCode:
    """A ``VllmCode`` from vLLM's modules by name (installed, or loaded some other way)."""
    inputs = modules["vllm.multimodal.inputs"]
    utils = modules["vllm.model_executor.models.utils"]
    runner_v2 = modules.get("vllm.v1.worker.gpu.mm.encoder_runner")
    runner_v1 = modules.get("vllm.v1.worker.gpu_model_runner")
    mm_utils = modules.get("vllm.multimodal.utils")
    return VllmCode(
        version=version, PlaceholderRange=inputs.PlaceholderRange, MultiModalFeatureSpec=inputs.MultiModalFeatureSpec,
        merge=utils._merge_multimodal_embeddings,
        encoder_runner=getattr(runner_v2, "EncoderRunner", None),
        gpu_model_runner=getattr(runner_v1, "GPUModelRunner", None),
        public_merge=getattr(utils, "merge_multimodal_embeddings", None),
        modalities=getattr(mm_utils, "get_mm_embedding_modalities", None),
    )


def from_installed() -> tuple[VllmCode, list[str]]:
    """The installed vLLM's code, and the runner modules that could not be imported here
    (their gathers are then left out of the comparison)."""
    import importlib

    import vllm

    modules, skipped = {}, []
    for name in ("vllm.multimodal.inputs", "vllm.multimodal.utils", "vllm.model_executor.models.utils"):
        modules[name] = importlib.import_module(name)
    for name in ("vllm.v1.worker.gpu.mm.encoder_runner", "vllm.v1.worker.gpu_model_runner"):
        try:
            modules[name] = importlib.import_module(name)
        except Exception as exc:  # a runner module may need a device or optional packages
            skipped.append(f"{name} ({type(exc).__name__}: {exc})")
    return from_modules(vllm.__version__, modules), skipped


# -- cases --------------------------------------------------------------------------------


@dataclass
class Case:
    """One step: vLLM's objects and our inputs for them."""

    seed: int
    dtype: Any
    hidden: int
    req_ids: list[str]
    features: dict[str, list]
    computed: list[int]
    scheduled: list[int]
    prefill_lens: list[int]
    outputs: dict[str, Any]
    text: Any  # [tokens, H] text embeddings of the step
    notes: list[str] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(self.scheduled)


MODALITIES = ("image", "image", "video", "audio")  # mostly images, as in serving


def build_case(code: VllmCode, seed: int, *, dtype=None, hidden: int = 32, n_requests: int | None = None,
               embed_masks: bool = True, shared: bool = True, chunked: bool = True) -> Case:
    dtype = dtype or torch.float32
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    n_requests = n_requests or rng.randint(1, 6)
    outputs: dict[str, Any] = {}
    shared_pool: list[tuple[str, int, Any]] = []  # (mm_hash, length, is_embed) other requests may reuse
    req_ids, features, computed, scheduled, prefill = [], {}, [], [], []
    for r in range(n_requests):
        req = f"req-{seed}-{r}"
        pos = rng.randint(0, 5)
        feats = []
        for _ in range(rng.randint(0, 4)):
            if shared and shared_pool and rng.random() < 0.4:
                key, length, is_embed, modality = rng.choice(shared_pool)
            else:
                modality = rng.choice(MODALITIES)
                length = rng.randint(1, 24)
                is_embed = None
                if embed_masks and rng.random() < 0.5:
                    is_embed = torch.rand(length, generator=gen) < 0.7
                    if rng.random() < 0.2:
                        is_embed[: rng.randint(0, length)] = False  # a leading text run
                key = f"mm-{seed}-{len(outputs) + len(shared_pool)}"
                rows = length if is_embed is None else int(is_embed.sum())
                outputs[key] = torch.randn(rows, hidden, generator=gen).to(dtype)
                shared_pool.append((key, length, is_embed, modality))
            feats.append(code.MultiModalFeatureSpec(data=None, modality=modality, identifier=key,
                                                    mm_position=code.PlaceholderRange(pos, length, is_embed)))
            pos += length + rng.randint(0, 4)
        prompt = pos + rng.randint(0, 3) + 1
        if rng.random() < 0.15:  # a decode request
            done, count = prompt + rng.randint(0, 5), 1
        elif chunked:
            done = rng.randint(0, prompt - 1)
            count = rng.randint(1, prompt - done)
        else:
            done, count = 0, prompt
        req_ids.append(req)
        features[req] = feats
        computed.append(done)
        scheduled.append(count)
        prefill.append(prompt)
    n_tokens = sum(scheduled)
    text = torch.randn(n_tokens, hidden, generator=gen).to(dtype)
    return Case(seed, dtype, hidden, req_ids, features, computed, scheduled, prefill, outputs, text)


# -- the two sides ------------------------------------------------------------------------


def _query_starts(case: Case):
    import numpy as np

    return np.concatenate([[0], np.cumsum(case.scheduled)]).astype(np.int64)


def vllm_gather_v2(code: VllmCode, case: Case):
    import numpy as np

    runner = code.encoder_runner.__new__(code.encoder_runner)
    runner.encoder_cache = types.SimpleNamespace(mm_features=case.features, encoder_outputs=case.outputs)
    runner.is_realtime = False
    return code.encoder_runner.gather_mm_embeddings(
        runner, case.req_ids, case.n_tokens, np.array(case.scheduled, dtype=np.int32), _query_starts(case),
        np.array(case.prefill_lens, dtype=np.int32), np.array(case.computed, dtype=np.int32))


def v1_state(case: Case):
    """Model runner v1's ``(scheduler_output, req_ids, requests)`` for a case."""
    requests = {r: types.SimpleNamespace(num_computed_tokens=c, mm_features=case.features[r])
                for r, c in zip(case.req_ids, case.computed)}
    scheduler_output = types.SimpleNamespace(total_num_scheduled_tokens=case.n_tokens,
                                             num_scheduled_tokens=dict(zip(case.req_ids, case.scheduled)))
    return scheduler_output, list(case.req_ids), requests


def vllm_gather_v1(code: VllmCode, case: Case):
    cls = code.gpu_model_runner
    runner = cls.__new__(cls)
    scheduler_output, req_ids, requests = v1_state(case)
    runner.input_batch = types.SimpleNamespace(req_ids=req_ids)
    runner.requests = requests
    runner.encoder_cache = case.outputs
    runner.is_multimodal_pruning_enabled = False
    runner.uses_mrope = False
    return cls._gather_mm_embeddings(runner, scheduler_output)


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _same(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a.contiguous()), _bits(b.contiguous()))


def _same_mask(a, b) -> bool:
    return a.dtype == b.dtype == torch.bool and torch.equal(a, b)


def compare(code: VllmCode, case: Case) -> list[str]:
    """Every difference between vLLM's results and ours on ``case`` (empty: all match)."""
    problems: list[str] = []
    where = f"seed {case.seed} ({str(case.dtype).removeprefix('torch.')})"
    gathers = []
    if code.encoder_runner is not None:
        gathers.append(("EncoderRunner.gather_mm_embeddings", vllm_gather_v2(code, case)))
    if code.gpu_model_runner is not None:
        gathers.append(("GPUModelRunner._gather_mm_embeddings", vllm_gather_v1(code, case)))
    if not gathers:
        return [f"{where}: vLLM {code.version} has neither gather"]
    theirs_list, theirs_mask = gathers[0][1]
    for name, (rows, mask) in gathers[1:]:  # vLLM's two runners agree with each other
        if not _same_mask(mask, theirs_mask) or len(rows) != len(theirs_list):
            problems.append(f"{where}: vLLM's {name} differs from {gathers[0][0]}")
    theirs_rows = torch.cat(theirs_list) if theirs_list else torch.empty(0, case.hidden, dtype=case.dtype)
    expected = code.merge(case.text.clone(), theirs_list, theirs_mask)

    step = ours_gather.plan_rows(case.req_ids, [case.features[r] for r in case.req_ids], case.computed,
                                 case.scheduled, case.outputs, prefill_lens=case.prefill_lens)
    poisoned = torch.full((max(step.n_rows, 1), case.hidden), float("nan"), dtype=case.dtype)
    packed = step.gather(out=poisoned)[: step.n_rows]
    if not _same(packed, theirs_rows):
        problems.append(f"{where}: gather() rows differ from vLLM's ({step.n_rows} vs {theirs_rows.shape[0]} rows)")
    if not _same_mask(step.is_mm_embed(), theirs_mask):
        problems.append(f"{where}: is_mm_embed() differs from vLLM's mask")
    fused = step.merge_into(case.text.clone())
    if not _same(fused, expected):
        problems.append(f"{where}: merge_into() leaves a different inputs_embeds than vLLM's gather + merge")
    dropin = ours_merge._merge_multimodal_embeddings(case.text.clone(), theirs_list, theirs_mask)
    if not _same(dropin, expected):
        problems.append(f"{where}: the drop-in _merge_multimodal_embeddings differs from vLLM's")
    rows_v2, mask_v2 = ours_gather.gather_mm_embeddings(
        types.SimpleNamespace(mm_features=case.features, encoder_outputs=case.outputs), case.req_ids, case.n_tokens,
        case.scheduled, _query_starts(case), case.prefill_lens, case.computed)
    rows_v1, mask_v1 = ours_gather.gather_mm_embeddings_v1(*v1_state(case), case.outputs)
    for name, rows, mask in (("gather_mm_embeddings", rows_v2, mask_v2), ("gather_mm_embeddings_v1", rows_v1, mask_v1)):
        merged = ours_merge._merge_multimodal_embeddings(case.text.clone(), rows, mask)
        if not (_same_mask(mask, theirs_mask) and _same(merged, expected)):
            problems.append(f"{where}: {name} + merge differs from vLLM's")
        if rows and not _same(code.merge(case.text.clone(), rows, mask), expected):
            problems.append(f"{where}: vLLM's merge of our {name} differs from its merge of its own gather")
        if code.modalities is not None and theirs_list and _by_modality(code, rows) != _by_modality(code, theirs_list):
            problems.append(f"{where}: {name}'s rows grouped by vLLM's get_mm_embedding_modalities differ from"
                            " vLLM's own gather's")
    return problems


def _by_modality(code: VllmCode, rows: list) -> dict:
    """The rows of each modality, concatenated in order (what the models that merge by
    modality write), as comparable bits; vLLM's own function reads the tags."""
    try:
        modalities = code.modalities(rows)
    except ValueError as exc:
        return {"error": str(exc)}
    return {m: _bits(torch.cat([r for r, k in zip(rows, modalities) if k == m]).contiguous()).tolist()
            for m in sorted(set(modalities))}


def run_cases(code: VllmCode, n_cases: int = 200, seed: int = 0) -> tuple[int, list[str]]:
    """``n_cases`` cases from ``seed`` on, alternating fp32 and bf16; (cases run, problems)."""
    problems: list[str] = []
    for k in range(n_cases):
        dtype = torch.bfloat16 if k % 2 else torch.float32
        problems += compare(code, build_case(code, seed + k, dtype=dtype))
    return n_cases, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mm_schedule.integrations.vllm.verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from .releases import installed_version

    version = installed_version()
    if torch is None or version is None:
        missing = "vLLM" if version is None else "torch"
        print(f"{parser.prog}: {missing} is not installed in this Python environment ({sys.executable}), so"
              " there is no vLLM to compare with; run it where vLLM is installed", file=sys.stderr)
        return 2
    try:
        code, skipped = from_installed()
    except Exception as exc:
        print(f"{parser.prog}: vLLM {version} is installed but its modules do not import"
              f" ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"not compared: {line}")
    from .releases import accept_release

    accept_release(code.version)  # verifying a release is how it gets accepted
    n, problems = run_cases(code, args.cases, args.seed)
    for line in problems:
        print(line)
    runners = [n for n, c in (("v2 EncoderRunner", code.encoder_runner), ("v1 GPUModelRunner", code.gpu_model_runner)) if c]
    status = "MATCH" if not problems else f"{len(problems)} DIFFERENCES"
    print(f"vLLM {code.version} ({', '.join(runners)}): {n} cases, {status}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
