"""Where a move map's inputs come from: a module's source file, or the module's file read
out of a wheel or sdist (a path, or a pin like ``sglang==0.5.17`` downloaded with pip into
the wheel cache)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from ...errors import MoveMapError
from . import remote

WHEEL_CACHE_ENV = "MM_SCHEDULE_WHEEL_CACHE"


def default_wheel_cache() -> Path:
    """Where downloaded wheels are kept: ``$MM_SCHEDULE_WHEEL_CACHE``, else
    ``~/.cache/mm-schedule/wheels`` (the benchmarks and tests share it)."""
    return Path(os.environ.get(WHEEL_CACHE_ENV) or Path.home() / ".cache" / "mm-schedule" / "wheels")


REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")



class MissingModule(MoveMapError):
    """The archive has no file for the module asked for."""


@dataclass(frozen=True)
class Source:
    """One module's source text and where it came from (for the header)."""

    module: str
    text: str
    is_package: bool  # an ``__init__.py``: relative imports resolve against the module itself
    origin: str  # "path/to/file.py", or "sglang 0.5.17: sglang/srt/managers/mm_utils.py"

    @property
    def package(self) -> str:
        return self.module if self.is_package else self.module.rpartition(".")[0]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def describe(self, role: str) -> dict:
        return {"role": role, "module": self.module, "source": self.origin, "sha256": self.sha256}


def read_source(path: str | os.PathLike, module: str) -> Source:
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise MoveMapError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise MoveMapError(f"{path} is not UTF-8: {exc}") from exc
    return Source(module=module, text=text, is_package=p.name == "__init__.py", origin=os.fspath(path))


def module_from_path(path: str | os.PathLike, package_root: str) -> str:
    """``.../sglang/srt/managers/mm_utils.py`` with root ``sglang`` -> ``sglang.srt.managers.mm_utils``."""
    parts = Path(os.path.abspath(path)).parts
    root = package_root.split(".")[0]
    if root not in parts[:-1]:
        raise MoveMapError(f"{path}: no directory named {root!r} (--package-root) in its path")
    start = len(parts) - 1 - parts[::-1].index(root, 1)
    dotted = [*parts[start:-1], Path(parts[-1]).stem]
    if dotted[-1] == "__init__":
        dotted.pop()
    module = ".".join(dotted)
    if not (module == package_root or module.startswith(package_root + ".")):
        raise MoveMapError(f"{path} is module {module!r}, which is not under {package_root!r}")
    return module


@contextmanager
def _open_archive(archive: Path) -> Iterator[tuple[list[str], Callable[[str], bytes]]]:
    """(member names, read(member) -> bytes) of a wheel, zip or source tarball."""
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as zf:
            yield zf.namelist(), zf.read
    elif archive.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(archive) as tf:
            yield tf.getnames(), lambda member: tf.extractfile(member).read()
    else:
        raise MoveMapError(f"{archive}: not a wheel, zip or source tarball")


def _distribution(names: list[str], read: Callable[[str], bytes]) -> tuple[str, str] | None:
    for member in sorted(names):
        tail = PurePosixPath(member)
        is_wheel_meta = tail.name == "METADATA" and tail.parent.name.endswith(".dist-info")
        is_sdist_meta = tail.name == "PKG-INFO" and len(tail.parts) == 2
        if is_wheel_meta or is_sdist_meta:
            meta = HeaderParser().parsestr(read(member).decode("utf-8", "replace"))
            if meta.get("Name") and meta.get("Version"):
                return meta["Name"], meta["Version"]
    return None


def archive_distribution(archive: Path) -> tuple[str, str] | None:
    """(name, version) from an archive's own metadata, or None when it has none."""
    try:
        with _open_archive(archive) as (names, read):
            return _distribution(names, read)
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise MoveMapError(f"cannot open {archive}: {exc}") from exc


def read_archive_source(archive: str | os.PathLike, module: str) -> Source:
    """The file of ``module`` inside a wheel (or sdist), e.g. ``sglang/srt/managers/mm_utils.py``."""
    archive = Path(archive)
    rel = module.replace(".", "/")
    wanted = (f"{rel}.py", f"{rel}/__init__.py")
    try:
        with _open_archive(archive) as (names, read):
            # A wheel holds the module at its root; an sdist nests it (``pkg-1.0/python/...``).
            hits = sorted((n for n in names if n in wanted or n.endswith(tuple("/" + w for w in wanted))),
                          key=lambda n: (len(n), n))
            if not hits:
                raise MissingModule(f"{archive.name} has no file for module {module!r} (looked for {wanted[0]})")
            member = hits[0]
            raw = read(member)
            dist = _distribution(names, read)
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise MoveMapError(f"cannot open {archive}: {exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MoveMapError(f"{archive.name}:{member} is not UTF-8: {exc}") from exc
    label = f"{dist[0]} {dist[1]}" if dist else archive.name
    return Source(module=module, text=text, is_package=member.endswith("/__init__.py"),
                  origin=f"{label}: {member}")


def fetch_archive(spec: str, cache: Path | None = None, timeout: float = 120.0) -> Path:
    """A path to a wheel: ``spec`` itself when it is a file, else ``dist==version`` from the
    cache folder, downloaded there with pip (``--no-deps``) when missing."""
    if Path(spec).is_file():
        return Path(spec)
    match = REQUIREMENT.match(spec)
    if not match:
        raise MoveMapError(f"{spec!r} is neither an existing file nor a pinned requirement like sglang==0.5.17")
    cache = Path(cache) if cache else default_wheel_cache()
    found = _cached_archive(cache, *match.groups())
    if found:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--timeout", str(max(1, int(timeout / 4))), "--retries", "1", "-d", str(cache), spec]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise MoveMapError(f"downloading {spec} took longer than {timeout:.0f} s") from exc
    found = _cached_archive(cache, *match.groups())
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no archive appeared"]
        raise MoveMapError(f"pip could not download {spec}: {tail[0]}")
    return found


def release_source(spec: str, module: str, cache: Path | None = None,
                   index_url: str | None = None) -> Source | None:
    """The file of ``module`` in one release, or None when that release has no such module.
    ``spec`` is an archive path or a pin; a pin is read from a full archive in the cache,
    else only the module's file is read off the index (``remote``), else the archive is
    downloaded with pip. For the many releases a map's history covers."""
    match = REQUIREMENT.match(spec)
    cache = Path(cache) if cache else default_wheel_cache()
    if Path(spec).is_file() or not match or _cached_archive(cache, *match.groups()):
        return _archive_source_or_none(fetch_archive(spec, cache), module)
    dist, version = match.groups()
    member = module.replace(".", "/")
    wanted = (f"{member}.py", f"{member}/__init__.py")
    try:
        wheel, found = remote.read_members(dist, version, wanted, cache, index_url or remote.INDEX_URL)
    except (OSError, ValueError, zipfile.BadZipFile):
        return _archive_source_or_none(fetch_archive(spec, cache), module)
    for name in wanted:
        if name in found:
            try:
                text = found[name].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MoveMapError(f"{wheel}:{name} is not UTF-8: {exc}") from exc
            return Source(module=module, text=text, is_package=name.endswith("/__init__.py"),
                          origin=f"{dist} {version}: {name}")
    return None


def _archive_source_or_none(archive: Path, module: str) -> Source | None:
    try:
        return read_archive_source(archive, module)
    except MissingModule:
        return None


def _cached_archive(cache: Path, dist: str, version: str) -> Path | None:
    if not cache.is_dir():
        return None
    stem = re.sub(r"[-_.]+", "_", dist).lower()
    candidates = []
    for entry in sorted(cache.iterdir()):
        name = entry.name.lower()
        for prefix in (f"{stem}-{version}-", f"{stem.replace('_', '-')}-{version}-"):
            if name.startswith(prefix) and name.endswith(".whl"):
                candidates.append(entry)
        if name in (f"{stem}-{version}.tar.gz", f"{dist.lower()}-{version}.tar.gz"):
            candidates.append(entry)
    # Prefer wheels: they hold the installed layout.
    candidates.sort(key=lambda p: (not p.name.endswith(".whl"), p.name))
    return candidates[0] if candidates else None


