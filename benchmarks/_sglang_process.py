"""A CPU process that looks like a loaded SGLang, for checking the stand-in against it.

``SGLangProcess("0.5.19")`` loads the release's real modules from its wheel (through
``_sglang_wheels``) and, inside a ``with`` block, registers them under their ``sglang.*``
names together with the few stubs SGLang's own unit tests and ``mm_utils.embed_mm_inputs``
need: ``schedule_batch`` (``Modality``, ``MultimodalDataItem``), ``runtime_context``
(overridable single-process parallel state), ``kv_cache_builder`` (bound to the real
``init_mm_embedding_cache`` at its import, as the real module is) and the CI registry.
On exit every ``sglang`` entry of ``sys.modules`` is removed again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import linecache
import sys
import types
import zipfile
from typing import Any

import _sglang_wheels as wheels

PARALLEL_DEFAULT = {"attn_tp_rank": 0, "attn_tp_size": 1, "tp_size": 1}


class Modality(enum.Enum):
    IMAGE = enum.auto()
    MULTI_IMAGES = enum.auto()
    VIDEO = enum.auto()
    AUDIO = enum.auto()

    @staticmethod
    def all() -> list[Modality]:
        return list(Modality)


@dataclasses.dataclass
class MultimodalDataItem:
    """The fields of SGLang's item that the embedding path reads."""

    modality: Any = Modality.IMAGE
    hash: Any = None
    feature: Any = None
    offsets: Any = None
    precomputed_embeddings: Any = None
    pad_value: Any = None
    model_specific_data: dict = dataclasses.field(default_factory=dict)
    acknowledged: list = dataclasses.field(default_factory=list)
    # Stands for a CUDA-IPC proxy feature whose reconstruction may be deferred.
    deferred_ipc: bool = False

    def is_modality(self, modality: Modality) -> bool:
        return self.modality == modality

    def is_audio(self) -> bool:
        return self.modality == Modality.AUDIO

    def is_video(self) -> bool:
        return self.modality == Modality.VIDEO

    @property
    def pre_chunked_input_ids(self) -> Any:
        return self.model_specific_data.get("pre_chunked_input_ids")

    def acknowledge_deferred_cuda_ipc_feature(self, consumers: int) -> None:
        self.acknowledged.append(consumers)

    def can_defer_cuda_ipc_feature_reconstruction(self) -> bool:
        return self.deferred_ipc and self.hash is not None and self.pad_value is not None

    def padding_values(self) -> tuple:
        """(0.5.23) The placeholder ids of the item: its one pad value here."""
        return (self.pad_value,)


class ParallelState:
    """SGLang's parallel accessor as a single CPU process sees it, overridable per test."""

    def __init__(self) -> None:
        self.__dict__.update(PARALLEL_DEFAULT)

    @contextlib.contextmanager
    def override(self, **values: int):
        saved = dict(self.__dict__)
        self.__dict__.update(values)
        try:
            yield self
        finally:
            self.__dict__.clear()
            self.__dict__.update(saved)


class _Override:
    def install(self) -> None:
        pass

    def restore(self) -> None:
        pass


class RuntimeContext:
    def override_server_args(self, **_values: Any) -> _Override:
        return _Override()


PARALLEL = ParallelState()
CONTEXT = RuntimeContext()


def _get_parallel() -> ParallelState:
    return PARALLEL


def _get_context() -> RuntimeContext:
    return CONTEXT


def _schedule() -> Any:
    return types.SimpleNamespace(chunked_prefill_size=-1)


def _register_cpu_ci(**_kwargs: Any) -> None:
    return None


STUBS: dict[str, dict[str, object]] = {
    "sglang.srt.managers.schedule_batch": {"Modality": Modality, "MultimodalDataItem": MultimodalDataItem},
    "sglang.srt.runtime_context": {"get_parallel": _get_parallel, "get_context": _get_context,
                                   "get_schedule": _schedule},
    "sglang.test.ci.ci_register": {"register_cpu_ci": _register_cpu_ci},
    # The key SGLang (0.5.20+) marks borrowed CUDA-IPC features with, as its transport defines it.
    "sglang.srt.multimodal.transport.cuda_ipc": {"BORROW_CUDA_IPC_FEATURE_KEY": "_sglang_borrow_cuda_ipc_feature"},
}


class SGLangProcess:
    def __init__(self, version: str) -> None:
        self.version = version
        saved = dict(wheels.STUB_ATTRIBUTES)
        for name, attrs in STUBS.items():
            wheels.STUB_ATTRIBUTES[name] = {**wheels.STUB_ATTRIBUTES.get(name, {}), **attrs}
        _register_sources(version)
        try:
            self.release = wheels.load_release(version)
        finally:
            wheels.STUB_ATTRIBUTES.clear()
            wheels.STUB_ATTRIBUTES.update(saved)
        self.scheduler = self.release.scheduler
        self.mm_utils = self.release.mm_utils
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> SGLangProcess:
        self._saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
        for k in self._saved:
            del sys.modules[k]
        modules = dict(self.release.modules)
        for name, attrs in STUBS.items():
            modules[name] = _module(name, attrs)
        modules["sglang.srt.mem_cache.kv_cache_builder"] = _module(
            "sglang.srt.mem_cache.kv_cache_builder", {"init_mm_embedding_cache": self.scheduler.init_mm_embedding_cache}
        )
        for name in list(modules):
            parts = name.split(".")
            for i in range(1, len(parts)):
                modules.setdefault(".".join(parts[:i]), _module(".".join(parts[:i]), {}, package=True))
        modules["sglang"].__version__ = self.version
        for name, module in modules.items():
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(modules[parent], child, module)
        sys.modules.update(modules)
        return self

    def __exit__(self, *exc: object) -> None:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(self._saved)


def _register_sources(version: str) -> None:
    """Put the wheel's module sources into ``linecache`` under the names the loader gives
    them, so code that reads its own source (``triton.jit`` in 0.5.23's probes) finds it."""
    wheel = wheels.fetch_wheel(version)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for module in wheels.REAL_MODULES:
            rel = module.replace(".", "/")
            for member in (f"{rel}.py", f"{rel}/__init__.py"):
                if member in names:
                    text = archive.read(member).decode()
                    filename = f"{wheel}/{member}"
                    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)


def _module(name: str, attrs: dict[str, object], *, package: bool = False) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    if package:
        module.__path__ = []
    return module
