"""vLLM's own multimodal gather and merge, loaded from the official wheel on CPU.

``load_release("0.33.0")`` gives the real source of the few vLLM modules on the
multimodal embedding path, executed with every other vLLM import stubbed:

* ``vllm.multimodal.inputs`` (``PlaceholderRange``, ``MultiModalFeatureSpec``),
* ``vllm.multimodal.utils`` (``get_mm_features_in_window``),
* ``vllm.model_executor.models.utils`` (``_merge_multimodal_embeddings``, and
  ``merge_multimodal_embeddings`` in the releases that still have it),
* ``vllm.v1.worker.gpu.mm.encoder_runner`` (``EncoderRunner.gather_mm_embeddings``, the
  model runner v2) and ``vllm.v1.worker.gpu_model_runner`` (``GPUModelRunner.
  _gather_mm_embeddings``), where the release has them.

The wheel is a third of a gigabyte, and these files are a few hundred kilobytes of it.
They are read out of the wheel on the registry with HTTP range requests (the zip's
central directory at the end of the file, then each member's bytes; zipfile checks
every member's CRC), as pip's lazy wheel reads metadata, and kept in a folder of the
wheel cache (``<cache>/vllm-<version>-src/``); later runs read that folder and need no
network. A full wheel already in the cache is read instead of the registry; with
``allow_full_download`` a registry that refuses range requests is answered by ``pip
download --no-deps`` of the whole wheel, whose members are then extracted and the wheel
deleted. No vLLM code lives in this repository.

Everything the real modules import from ``vllm`` besides each other is a stub: loggers
are ``logging`` loggers, ``PIN_MEMORY`` is False (a CPU process), a registration of a
custom op does nothing, ``LazyLoader`` imports the module it names, and any other name
is an import-only placeholder that raises if vLLM's code calls it on the measured path.
While a release loads its modules are registered under their ``vllm.*`` names;
afterwards every ``vllm`` entry is removed from ``sys.modules`` again (two releases can
live side by side in one process).
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import types
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peer_wheels as peer

from mm_schedule.codemods.movemap.remote import INDEX_URL, TIMEOUT_S, RangeReader, wheel_url
from mm_schedule.codemods.movemap.sources import default_wheel_cache

# Executed from the wheel's own source, in import order (later ones import earlier ones);
# a module missing from a release is skipped.
REAL_MODULES = (
    "vllm.multimodal.inputs",
    "vllm.multimodal.utils",
    "vllm.model_executor.models.utils",
    "vllm.v1.worker.gpu.mm.encoder_runner",
    "vllm.v1.worker.gpu_model_runner",
)
VERSION_MEMBER = "vllm/_version.py"
MEMBERS = (*(m.replace(".", "/") + ".py" for m in REAL_MODULES), VERSION_MEMBER)
MANIFEST = "MANIFEST.json"


WheelUnavailable = peer.WheelUnavailable
StubCalled = peer.StubCalled


# -- the source files ---------------------------------------------------------------------


def source_dir(version: str, cache: Path | None = None) -> Path:
    return (cache or default_wheel_cache()) / f"vllm-{version}-src"


def extract_sources(version: str, cache: Path | None = None, *, allow_full_download: bool = False,
                    index_url: str = INDEX_URL, timeout: float = TIMEOUT_S) -> Path:
    """The folder holding the release's files of ``MEMBERS`` (those it has), from the cache
    or read out of the wheel; see the module docstring."""
    cache = cache or default_wheel_cache()
    target = source_dir(version, cache)
    if (target / MANIFEST).is_file():
        return target
    local = sorted(cache.glob(f"vllm-{version}-*.whl")) if cache.is_dir() else []
    if local:
        with zipfile.ZipFile(local[0]) as archive:
            _extract(archive, local[0].name, target)
        return target
    try:
        name, url = wheel_url("vllm", version, index_url, timeout)
        with zipfile.ZipFile(RangeReader(url, timeout)) as archive:
            _extract(archive, name, target)
        return target
    except (OSError, ValueError, zipfile.BadZipFile, urllib.error.URLError) as exc:
        if not allow_full_download:
            raise WheelUnavailable(f"cannot read vllm=={version} from {index_url}: {exc}") from exc
    wheel = _pip_download(version, cache, timeout * 10)
    try:
        with zipfile.ZipFile(wheel) as archive:
            _extract(archive, wheel.name, target)
    finally:
        wheel.unlink(missing_ok=True)
    return target


def _extract(archive: zipfile.ZipFile, wheel_name: str, target: Path) -> None:
    names = set(archive.namelist())
    present = [m for m in MEMBERS if m in names]
    if VERSION_MEMBER not in present or "vllm/model_executor/models/utils.py" not in present:
        raise WheelUnavailable(f"{wheel_name} lacks the files this harness runs")
    for member in present:
        path = target / member
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(archive.read(member))  # zipfile raises on a CRC mismatch
    # Written last: a folder without it is an interrupted extraction and is redone.
    (target / MANIFEST).write_text(json.dumps({"wheel": wheel_name, "members": present}, indent=1) + "\n")


def _pip_download(version: str, cache: Path, timeout: float) -> Path:
    return peer.pip_download("vllm", version, cache, timeout, "--only-binary", ":all:")


# -- stubs --------------------------------------------------------------------------------


_loading = False


class _PlaceholderType(type):
    """Calling a placeholder raises, except while a release's modules execute: then a
    decorator (``@stub`` or ``@stub(...)``) leaves the function it decorates unchanged,
    so that class bodies and module-level definitions can run."""

    def __call__(cls, *args, **kwargs):
        if _loading:
            if len(args) == 1 and not kwargs and callable(args[0]):
                return args[0]
            return lambda fn: fn
        raise StubCalled(f"{cls.__module__}.{cls.__name__} is an import-only stub but was called")

    def __getitem__(cls, _item):
        return cls

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(cls.__module__, f"{cls.__name__}.{name}")


def _placeholder(module: str, name: str) -> type:
    # A class, so that vLLM modules may subclass it, subscript it or use it in annotations.
    return _PlaceholderType(name, (), {"__module__": module})


class _StubModule(peer.StubModule):
    placeholder = staticmethod(_placeholder)


def _lazy_loader(_local_name, _parent_globals, name):
    return importlib.import_module(name)


def _no_op(*_args, **_kwargs):
    return None


STUB_ATTRIBUTES: dict[str, dict[str, object]] = {
    "vllm.logger": {"init_logger": logging.getLogger},
    "vllm.utils.import_utils": {"LazyLoader": _lazy_loader},
    "vllm.utils.torch_utils": {"PIN_MEMORY": False, "direct_register_custom_op": _no_op},
    "vllm.utils.platform_utils": {"is_pin_memory_available": lambda: False},
}


@dataclass
class Release:
    """One vLLM release's real modules, by their ``vllm.*`` names."""

    version: str
    source: Path
    wheel: str
    modules: dict[str, types.ModuleType] = field(default_factory=dict)
    stubbed: list[str] = field(default_factory=list)

    @property
    def inputs(self) -> types.ModuleType:
        return self.modules["vllm.multimodal.inputs"]

    @property
    def models_utils(self) -> types.ModuleType:
        return self.modules["vllm.model_executor.models.utils"]

    @property
    def encoder_runner(self) -> types.ModuleType | None:
        return self.modules.get("vllm.v1.worker.gpu.mm.encoder_runner")

    @property
    def gpu_model_runner(self) -> types.ModuleType | None:
        return self.modules.get("vllm.v1.worker.gpu_model_runner")


def _folder_reader(root: Path) -> peer.SourceReader:
    def read(fullname: str) -> tuple[str, bytes, bool] | None:
        path = root / (fullname.replace(".", "/") + ".py")
        return (str(path), path.read_bytes(), False) if path.is_file() else None

    return read


def load_release(version: str, cache: Path | None = None, *, allow_full_download: bool = False) -> Release:
    """Fetch (if needed) and load one release's real modules; see the module docstring."""
    root = extract_sources(version, cache, allow_full_download=allow_full_download)
    manifest = json.loads((root / MANIFEST).read_text())
    loader = peer.PeerLoader("vllm", REAL_MODULES, _folder_reader(root), STUB_ATTRIBUTES, _StubModule)
    global _loading
    _loading = True
    try:
        modules = peer.load_modules(loader, REAL_MODULES)
    finally:
        _loading = False
    return Release(version=version, source=root, wheel=manifest["wheel"], modules=modules,
                   stubbed=sorted(loader.stubbed))
