"""mm_schedule: multimodal embeddings into LLM prefill.

Our API: ``EmbeddingCache``, ``RequestChunk``, ``Encoder``, ``StepContext``/``ParallelContext``,
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
    "combine_hashes": "keys",
    "item_key": "keys",
    "content_hash": "hashing",
    "MMItem": "items",
    "Encoder": "encode",
    "ParallelContext": "context",
    "StepContext": "context",
    "acknowledge_deferred_ipc": "context",
    "RequestChunk": "plan",
    "StepPlan": "plan",
    "SourceKind": "plan",
    "plan_step": "planner",
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
    "EVSEmbeddingResult": "evs",
    "set_step_context": "sglang_compat",
    "count_mm_tokens_in_extend": "sglang_compat",
    "placeholder_mask": "placeholders",
}
# Module state that is rebound at runtime: always read from its module, never cached here.
_LIVE = frozenset({"embedding_cache"})

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mm_schedule' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    if name not in _LIVE:
        globals()[name] = value  # later lookups skip this function entirely
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
