"""mm_schedule: multimodal embeddings into LLM prefill.

Our API: ``EmbeddingCache``, ``RequestChunk``, ``Encoder``, ``StepContext``/``ParallelContext``,
``plan_step``, ``embed_chunk`` (packed rows) and ``merge_chunk`` (rows written into
``input_embeds``). SGLang-compatible names (``init_mm_embedding_cache``,
``embedding_cache``, ``get_embedding_chunk``, ``get_embedding_and_mask``,
``DataEmbeddingFunc``, ``PerImageRequestInfo``) are importable from here too.

Subpackages load on first use too: ``mm_schedule.kernels`` (Triton kernels and their torch
references), ``mm_schedule.codemods`` (the libcst codemod, no torch), ``mm_schedule.integrations``.
Importing this package loads neither torch nor triton; they load on first use, and a name
that needs torch says so when torch is not installed.
"""

import os
import sys
from importlib import import_module

__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

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
    "EVSEmbeddingResult": "evs",
    "set_step_context": "sglang_compat",
    "count_mm_tokens_in_extend": "sglang_compat",
    "placeholder_mask": "placeholders",
}
# Module state that is rebound at runtime: always read from its module, never cached here.
_LIVE = frozenset({"embedding_cache"})
_SUBPACKAGES = ("codemods", "integrations", "kernels", "ranks")
# Subpackages whose folders sit at the repository root (pyproject.toml's package-dir):
# inside this package in a wheel, beside it in a source checkout.
_CHECKOUT_FOLDERS = {"kernels": "kernels", "codemods": "codemods"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        with _needs_torch(f"mm_schedule.{name}"):
            return import_module(f".{name}", __name__)  # the import binds it here as well
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mm_schedule' has no attribute {name!r}")
    with _needs_torch(f"mm_schedule.{name}"):
        value = getattr(import_module(f".{module}", __name__), name)
    if name not in _LIVE:
        globals()[name] = value  # later lookups skip this function entirely
    return value


def __dir__():
    return sorted({*globals(), *__all__, *_SUBPACKAGES})


class _needs_torch:
    """Turns "No module named 'torch'" raised while loading ``what`` into an error that
    says what needed torch and how to get it. The codemod never needs it."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        name = getattr(error, "name", None) or ""
        if isinstance(error, ModuleNotFoundError) and (name == "torch" or name.startswith("torch.")):
            raise ModuleNotFoundError(
                f"{self.what} needs torch, which is not installed: pip install 'mm-schedule[torch]'"
                " (or install torch for your accelerator first; mm_schedule.codemods needs only libcst)",
                name=name,
            ) from error
        return False


class _CheckoutFinder:
    """Finds ``mm_schedule.kernels`` and ``mm_schedule.codemods`` in their folders beside
    this package's source folder, where a source checkout has them."""

    def __init__(self, folders: dict[str, str]) -> None:
        self.folders = folders

    def find_spec(self, fullname, path=None, target=None):
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        from importlib.util import spec_from_file_location

        init = os.path.join(folder, "__init__.py")
        return spec_from_file_location(fullname, init, submodule_search_locations=[folder])


def _find_checkout_subpackages() -> None:
    """When this package is imported from a source checkout (its root on ``sys.path``, as
    the working directory is for ``python -m mm_schedule.codemods``), the checkout's
    ``mm_schedule/`` folder shadows any installed copy and lacks the subpackages that
    pyproject.toml maps in from other folders: find them there. A wheel's package holds
    them itself and is left alone."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if not os.path.isfile(os.path.join(root, "pyproject.toml")):
        return
    folders = {
        f"{__name__}.{name}": os.path.join(root, folder)
        for name, folder in _CHECKOUT_FOLDERS.items()
        if not os.path.isdir(os.path.join(here, name))
        and os.path.isfile(os.path.join(root, folder, "__init__.py"))
    }
    if folders and not any(type(f).__name__ == "_CheckoutFinder" for f in sys.meta_path):
        sys.meta_path.append(_CheckoutFinder(folders))


_find_checkout_subpackages()
