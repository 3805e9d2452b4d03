"""mm_schedule: multimodal embeddings into LLM prefill.

Our API: ``EmbeddingCache``, ``RequestChunk``, ``StepContext``/``ParallelContext``,
``plan_step``, ``embed_chunk`` (packed rows) and ``merge_chunk`` (rows written into
``input_embeds``). SGLang-compatible names (``init_mm_embedding_cache``,
``embedding_cache``, ``get_embedding_chunk``, ``get_embedding_and_mask``,
``DataEmbeddingFunc``, ``PerImageRequestInfo``) are importable from here too.

Importing this package loads neither torch nor triton; they load on first use.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "EmbeddingCache": "cache",
    "CacheStats": "cache",
    "EmbeddingResult": "cache",
    "combine_hashes": "cache",
    "content_hash": "hashing",
    "MMItem": "items",
    "ParallelContext": "context",
    "StepContext": "context",
    "acknowledge_deferred_ipc": "context",
    "RequestChunk": "plan",
    "StepPlan": "plan",
    "plan_step": "plan",
    "embed_chunk": "scheduler",
    "merge_chunk": "scheduler",
    "StepResult": "scheduler",
    "StepReport": "scheduler",
    # SGLang-compatible surface
    "init_mm_embedding_cache": "sglang_compat",
    "embedding_cache": "sglang_compat",
    "get_embedding_chunk": "sglang_compat",
    "get_embedding_and_mask": "sglang_compat",
    "DataEmbeddingFunc": "sglang_compat",
    "PerImageRequestInfo": "sglang_compat",
    "set_step_context": "sglang_compat",
    "count_mm_tokens_in_extend": "sglang_compat",
    "placeholder_mask": "sglang_compat",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # Resolved on every access rather than cached, so ``mm_schedule.embedding_cache``
    # stays live after ``init_mm_embedding_cache`` rebinds it.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mm_schedule' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)


def __dir__():
    return sorted(list(globals()) + __all__)
