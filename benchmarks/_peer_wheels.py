"""What every peer loader shares: fetching a release's wheel, and executing a few of its
real modules with the rest of the package stubbed.

``_sglang_wheels`` and ``_vllm_wheel`` each name their package, the modules they run and
the stub attributes those modules need; the machinery is here:

* ``pip_download`` / ``cached_wheel``: ``pip download --no-deps`` into the wheel cache
  (outside the repository), and finding a wheel already there;
* ``StubModule`` / ``refusing_placeholder``: a module whose every attribute not set
  explicitly is an import-only placeholder that raises ``StubCalled`` when called;
* ``PeerLoader`` + ``load_modules``: a meta-path finder that executes the real modules'
  source and stubs every other module of the package, registered under the package's
  names only while loading (``sys.modules`` is restored afterwards, so two releases of
  one package live side by side in one process).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import subprocess
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path


class WheelUnavailable(RuntimeError):
    """The release's files could not be downloaded (registry unreachable) or read."""


class StubCalled(RuntimeError):
    """Peer code called a name the harness only provides so that imports succeed."""


# -- wheels -------------------------------------------------------------------------------


def cached_wheel(cache: Path, package: str, version: str) -> Path | None:
    """A ``package==version`` wheel already in ``cache`` (any platform tag)."""
    if not cache.is_dir():
        return None
    hits = sorted(cache.glob(f"{package}-{version}-*.whl"))
    return hits[0] if hits else None


def pip_download(package: str, version: str, cache: Path, timeout: float, *extra: str) -> Path:
    """``pip download --no-deps package==version`` into ``cache``; the wheel's path."""
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", *extra,
           "-d", str(cache), f"{package}=={version}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise WheelUnavailable(f"downloading {package}=={version} took longer than {timeout:.0f} s") from exc
    except OSError as exc:  # no interpreter or pip to run
        raise WheelUnavailable(f"cannot run pip to download {package}=={version}: {exc}") from exc
    found = cached_wheel(cache, package, version)
    if proc.returncode != 0 or found is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel appeared"]
        raise WheelUnavailable(f"pip could not download {package}=={version}: {tail[0]}")
    return found


# -- stubs --------------------------------------------------------------------------------


def refusing_placeholder(module: str, name: str) -> type:
    """A class that raises ``StubCalled`` when instantiated (a class, so that peer modules
    may also subclass it or use it in annotations)."""

    def refuse(*_args, **_kwargs):
        raise StubCalled(f"{module}.{name} is an import-only stub but was called")

    return type(name, (), {"__init__": refuse, "__module__": module})


class StubModule(types.ModuleType):
    """A module whose every attribute not set explicitly is ``placeholder(module, name)``."""

    placeholder: Callable[[str, str], object] = staticmethod(refusing_placeholder)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(self).placeholder(self.__name__, name)
        setattr(self, name, value)
        return value


# -- loading ------------------------------------------------------------------------------

# ``(file name, source bytes, is package)`` of a real module, or None when the release lacks it.
SourceReader = Callable[[str], "tuple[str, bytes, bool] | None"]


class PeerLoader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves every module of ``package``: the ``real`` ones from ``read_source``, the
    others as ``stub_type`` modules carrying ``stub_attributes[name]``."""

    def __init__(self, package: str, real: Iterable[str], read_source: SourceReader,
                 stub_attributes: dict[str, dict[str, object]], stub_type: type[StubModule] = StubModule) -> None:
        self.package = package
        self.real = set(real)
        self.read_source = read_source
        self.stub_attributes = stub_attributes
        self.stub_type = stub_type
        self.stubbed: list[str] = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.package and not fullname.startswith(self.package + "."):
            return None
        found = self.read_source(fullname) if fullname in self.real else None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=found is None or found[2])

    def create_module(self, spec):
        if spec.name in self.real:
            module = types.ModuleType(spec.name)
        else:
            module = self.stub_type(spec.name)
            module.__dict__.update(self.stub_attributes.get(spec.name, {}))
            self.stubbed.append(spec.name)
        if spec.submodule_search_locations is not None:
            module.__path__ = []  # submodules resolve through this finder, not the file system
        return module

    def exec_module(self, module):
        if module.__name__ not in self.real:
            return
        found = self.read_source(module.__name__)
        if found is None:
            raise ModuleNotFoundError(f"no source of {module.__name__}")
        filename, source, is_package = found
        module.__file__ = filename
        module.__package__ = module.__name__ if is_package else module.__name__.rpartition(".")[0]
        exec(compile(source, filename, "exec"), module.__dict__)


def _owned(package: str) -> list[str]:
    return [k for k in sys.modules if k == package or k.startswith(package + ".")]


def load_modules(loader: PeerLoader, names: Iterable[str]) -> dict[str, types.ModuleType]:
    """Import ``names`` (in order, those ``loader`` has a source for) through ``loader``;
    ``sys.modules`` holds the package's entries it held before, and no others, afterwards."""
    saved = {k: sys.modules.pop(k) for k in _owned(loader.package)}
    modules: dict[str, types.ModuleType] = {}
    sys.meta_path.insert(0, loader)
    try:
        for name in names:
            if name in loader.real and loader.read_source(name) is not None:
                modules[name] = importlib.import_module(name)
    finally:
        sys.meta_path.remove(loader)
        for k in _owned(loader.package):
            del sys.modules[k]
        sys.modules.update(saved)
    return modules
