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
calls it on the measured path. No SGLang code lives in this repository.

Each release is loaded into its own set of module objects: while one loads, its
modules are registered under their ``sglang.*`` names; afterwards every ``sglang``
entry is removed from ``sys.modules`` again. The functions keep their own module
globals, so two releases run side by side in one process.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import logging
import subprocess
import sys
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from mm_schedule.codemods.derive import default_wheel_cache

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


class WheelUnavailable(RuntimeError):
    """The wheel could not be downloaded (registry unreachable) or read."""


# -- download -----------------------------------------------------------------------------


def fetch_wheel(version: str, cache: Path | None = None, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """The ``sglang==version`` wheel, from the cache or downloaded into it."""
    cache = cache or default_wheel_cache()
    found = _cached_wheel(cache, version)
    if found:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "--timeout", str(max(1, int(timeout / 4))), "--retries", "1", "-d", str(cache),
        f"sglang=={version}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise WheelUnavailable(f"downloading sglang=={version} took longer than {timeout:.0f} s") from exc
    except OSError as exc:  # no interpreter or pip to run
        raise WheelUnavailable(f"cannot run pip to download sglang=={version}: {exc}") from exc
    found = _cached_wheel(cache, version)
    if proc.returncode != 0 or found is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel appeared"]
        raise WheelUnavailable(f"pip could not download sglang=={version}: {tail[0]}")
    return found


def _cached_wheel(cache: Path, version: str) -> Path | None:
    if not cache.is_dir():
        return None
    hits = sorted(cache.glob(f"sglang-{version}-*.whl"))
    return hits[0] if hits else None


# -- stubs --------------------------------------------------------------------------------


class StubCalled(RuntimeError):
    """SGLang code called a name the harness only provides so that imports succeed."""


def _placeholder(module: str, name: str) -> type:
    def refuse(*_args, **_kwargs):
        raise StubCalled(f"{module}.{name} is an import-only stub but was called")

    # A class, so that SGLang modules may also subclass it or use it in annotations.
    return type(name, (), {"__init__": refuse, "__module__": module})


class _StubModule(types.ModuleType):
    """A module whose every attribute not set explicitly is an import-only placeholder."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(self.__name__, name)
        setattr(self, name, value)
        return value


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


class _WheelLoader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, archive: zipfile.ZipFile, wheel: Path) -> None:
        self.archive = archive
        self.wheel = wheel
        self.names = set(archive.namelist())
        self.stubbed: list[str] = []

    def _member(self, fullname: str) -> tuple[str, bool] | None:
        rel = fullname.replace(".", "/")
        if f"{rel}/__init__.py" in self.names:
            return f"{rel}/__init__.py", True
        if f"{rel}.py" in self.names:
            return f"{rel}.py", False
        return None

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        found = self._member(fullname) if fullname in REAL_MODULES else None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=found is None or found[1])

    def create_module(self, spec):
        if spec.name in REAL_MODULES:
            module = types.ModuleType(spec.name)
        else:
            module = _StubModule(spec.name)
            module.__dict__.update(STUB_ATTRIBUTES.get(spec.name, {}))
            self.stubbed.append(spec.name)
        if spec.submodule_search_locations is not None:
            module.__path__ = []  # submodules resolve through this finder, not the file system
        return module

    def exec_module(self, module):
        if module.__name__ not in REAL_MODULES:
            return
        found = self._member(module.__name__)
        if found is None:
            raise ModuleNotFoundError(f"{self.wheel.name} has no module {module.__name__}")
        member, _ = found
        module.__file__ = f"{self.wheel}/{member}"
        code = compile(self.archive.read(member), module.__file__, "exec")
        exec(code, module.__dict__)


def load_release(version: str, cache: Path | None = None) -> Release:
    """Download (if needed) and load one release's real modules; see the module docstring."""
    wheel = fetch_wheel(version, cache)
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    release = Release(version=version, wheel=wheel)
    try:
        with zipfile.ZipFile(wheel) as archive:
            loader = _WheelLoader(archive, wheel)
            sys.meta_path.insert(0, loader)
            try:
                for name in REAL_MODULES:
                    if loader._member(name) is None:
                        continue
                    __import__(name)
                    release.modules[name] = sys.modules[name]
            finally:
                sys.meta_path.remove(loader)
        release.stubbed = sorted(loader.stubbed)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelUnavailable(f"cannot read {wheel}: {exc}") from exc
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return release
