"""SGLang's own multimodal scheduling modules, loaded from the official wheels on CPU.

``load_release("0.5.19")`` downloads ``sglang==0.5.19`` with ``pip download --no-deps``
(once, into a cache folder outside the repository), then executes the wheel's real
source of the modules under test straight from the archive:

* ``sglang.srt.mem_cache.multimodal_cache`` (the LRU embedding cache),
* ``sglang.srt.managers.mm_schedule`` (0.5.18 and later) and ``sglang.srt.managers.mm_utils``,
* ``sglang.srt.multimodal.evs`` and ``sglang.srt.utils.async_probe``,
* ``sglang.srt.multimodal.processors.base_processor`` (EVS recomputes offsets with it).

Everything else those modules import from ``sglang`` is a stub defined below: the
runtime-context getters answer as a single-process, tensor-parallel-size-1 CUDA
deployment would (so the CUDA code path, cross-request batching, is what runs), the
platform probes say "not HIP/NPU/XPU/CPU", every environment flag reads as unset, and
any other imported name is an import-only placeholder that raises if SGLang's code ever
calls it on the measured path (the loading machinery is ``_peer_wheels``, shared with
the vLLM loader). No SGLang code lives in this repository.

Each release is loaded into its own set of module objects: while one loads, its
modules are registered under their ``sglang.*`` names; afterwards every ``sglang``
entry is removed from ``sys.modules`` again. The functions keep their own module
globals, so two releases run side by side in one process.
"""

from __future__ import annotations

import enum
import logging
import sys
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peer_wheels as peer

from mm_schedule.codemods.movemap.sources import default_wheel_cache

DOWNLOAD_TIMEOUT_S = 120.0

# Modules executed from the wheel's own source, in import order; the first ones are
# imported by the later ones. A name missing from a release (mm_schedule before 0.5.18)
# is skipped.
REAL_MODULES = (
    "sglang.srt.mem_cache.multimodal_cache",
    "sglang.srt.utils.async_probe",
    "sglang.srt.multimodal.processors.base_processor",
    "sglang.srt.multimodal.evs.evs_core",
    "sglang.srt.multimodal.evs.evs_module",
    "sglang.srt.multimodal.evs.evs_processor",
    "sglang.srt.multimodal.evs",
    "sglang.srt.managers.mm_schedule",
    "sglang.srt.managers.mm_utils",
)

WheelUnavailable = peer.WheelUnavailable
StubCalled = peer.StubCalled


def fetch_wheel(version: str, cache: Path | None = None, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """The ``sglang==version`` wheel, from the cache or downloaded into it."""
    cache = cache or default_wheel_cache()
    return peer.cached_wheel(cache, "sglang", version) or peer.pip_download(
        "sglang", version, cache, timeout, "--timeout", str(max(1, int(timeout / 4))), "--retries", "1")


# -- stubs --------------------------------------------------------------------------------


class _EnvFlag:
    def get(self):
        return False


class _Envs:
    """Every SGLang environment flag reads as unset (False)."""

    def __getattr__(self, name: str) -> _EnvFlag:
        return _EnvFlag()


class Modality(enum.Enum):
    IMAGE = enum.auto()
    VIDEO = enum.auto()
    AUDIO = enum.auto()


def _single_process_parallel():
    return types.SimpleNamespace(attn_tp_rank=0, attn_tp_size=1, tp_size=1)


def _schedule_without_chunk_limit():
    return types.SimpleNamespace(chunked_prefill_size=-1)


def _flatten_nested_list(nested):
    if isinstance(nested, list):
        return [x for sub in nested for x in _flatten_nested_list(sub)]
    return [nested]


def _false() -> bool:
    return False


# Explicit stub attributes: what the measured path calls, and module-level calls.
STUB_ATTRIBUTES: dict[str, dict[str, object]] = {
    "sglang.srt.runtime_context": {
        "get_parallel": _single_process_parallel,
        "get_schedule": _schedule_without_chunk_limit,
    },
    "sglang.srt.utils": {
        "is_hip": _false, "is_npu": _false, "is_xpu": _false, "is_cpu": _false,
        "flatten_nested_list": _flatten_nested_list,
        "envs": _Envs(),
        "logger": logging.getLogger("sglang"),
    },
    "sglang.srt.environ": {"envs": _Envs()},
    "sglang.utils": {"logger": logging.getLogger("sglang")},
    "sglang.srt.managers.schedule_batch": {"Modality": Modality},
}


# -- loading ------------------------------------------------------------------------------


@dataclass
class Release:
    """One SGLang release's real modules, by their ``sglang.*`` names."""

    version: str
    wheel: Path
    modules: dict[str, types.ModuleType] = field(default_factory=dict)
    stubbed: list[str] = field(default_factory=list)

    @property
    def scheduler(self) -> types.ModuleType:
        """The module that defines ``get_embedding_and_mask`` (mm_schedule from 0.5.18 on)."""
        return self.modules.get("sglang.srt.managers.mm_schedule") or self.modules["sglang.srt.managers.mm_utils"]

    @property
    def mm_utils(self) -> types.ModuleType:
        return self.modules["sglang.srt.managers.mm_utils"]

    @property
    def evs(self) -> types.ModuleType:
        return self.modules["sglang.srt.multimodal.evs.evs_module"]


def _zip_reader(archive: zipfile.ZipFile, wheel: Path) -> peer.SourceReader:
    names = set(archive.namelist())

    def read(fullname: str) -> tuple[str, bytes, bool] | None:
        rel = fullname.replace(".", "/")
        for member, is_package in ((f"{rel}/__init__.py", True), (f"{rel}.py", False)):
            if member in names:
                return f"{wheel}/{member}", archive.read(member), is_package
        return None

    return read


def load_release(version: str, cache: Path | None = None) -> Release:
    """Download (if needed) and load one release's real modules; see the module docstring."""
    wheel = fetch_wheel(version, cache)
    try:
        with zipfile.ZipFile(wheel) as archive:
            loader = peer.PeerLoader("sglang", REAL_MODULES, _zip_reader(archive, wheel), STUB_ATTRIBUTES)
            modules = peer.load_modules(loader, REAL_MODULES)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelUnavailable(f"cannot read {wheel}: {exc}") from exc
    return Release(version=version, wheel=wheel, modules=modules, stubbed=sorted(loader.stubbed))
