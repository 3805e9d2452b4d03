"""mm_schedule inside vLLM's model runner: the step's multimodal rows gathered and merged
by one planned, one-launch copy instead of a slice per item and a masked write.

Two calls, each a drop-in for the vLLM code it replaces (see docs/vllm.md):

* the gather, from the runner's scheduler state and its encoder-output store:
  ``gather_mm_embeddings`` (model runner v2's ``EncoderRunner.gather_mm_embeddings``),
  ``gather_mm_embeddings_v1`` (``GPUModelRunner._gather_mm_embeddings``), or ``plan_rows``
  and its ``StepRows`` (``gather()``, ``is_mm_embed()``, and ``merge_into(inputs_embeds)``,
  the fused path that writes the rows to their token rows without a mask);
* the merge: ``_merge_multimodal_embeddings`` / ``merge_multimodal_embeddings``, with
  the signatures and results of ``vllm.model_executor.models.utils``.

The releases it was compared with are ``SUPPORTED_RELEASES``; another installed vLLM is
verified at the first call by running its own gather and merge against ours on a few
CPU steps (``verify_release``), then accepted with one logged warning or refused
(``UnsupportedVLLMRelease``, naming the first difference); ``accept_release`` skips the
probe. Every error the integration raises is importable from here. Importing this
package imports neither vLLM nor torch; the submodules load on first use, and vLLM is
imported only to verify an unlisted release.
"""

from importlib import import_module

_EXPORTS = {
    "plan_rows": "gather",
    "plan_from_scheduler_output": "gather",
    "StepRows": "gather",
    "gather_mm_embeddings": "gather",
    "gather_mm_embeddings_v1": "gather",
    "_merge_multimodal_embeddings": "merge",
    "merge_multimodal_embeddings": "merge",
    "SUPPORTED_RELEASES": "releases",
    "check_release": "releases",
    "accept_release": "releases",
    "installed_version": "releases",
    "verify_release": "releases",
    "forget_installed_check": "releases",
    "EncoderCacheMiss": "errors",
    "UnsupportedVLLMRelease": "errors",
    "EmbeddingLengthMismatch": "errors",
    "InvalidItemError": "errors",
    "KernelInputError": "errors",
    "MMScheduleError": "errors",
    "SegmentError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
