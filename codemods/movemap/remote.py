"""A few files out of a released wheel on a package index, without downloading the wheel.

A wheel is a zip: its central directory sits at the end of the file, and each member's
bytes can be read on their own. HTTP range requests fetch just those parts (as pip's
lazy wheel reads metadata); ``zipfile`` checks each member's CRC. What was read is kept
in the wheel cache (``<cache>/<dist>-<version>-src/``), with a manifest naming the
members looked for and those found, so later runs need no network.
"""

from __future__ import annotations

import json
import urllib.request
import zipfile
from pathlib import Path

INDEX_URL = "https://pypi.org/simple"
TIMEOUT_S = 60.0
READ_AHEAD = 1 << 16  # bytes fetched at least per range request (zip headers come in small reads)
MANIFEST = "MANIFEST.json"


class RangeReader:
    """A read-only, seekable file over HTTP range requests, with one read-ahead buffer."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S) -> None:
        self.url, self.timeout = url, timeout
        self.requests = 0
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if response.headers.get("Accept-Ranges", "").lower() != "bytes":
                raise ValueError(f"{url} does not accept range requests")
            self.size = int(response.headers["Content-Length"])
        self.pos, self._start, self._buffer = 0, 0, b""

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (offset, self.pos + offset, self.size + offset)[whence]
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        if n <= 0:
            return b""
        if not (self._start <= self.pos and self.pos + n <= self._start + len(self._buffer)):
            end = min(self.size, self.pos + max(n, READ_AHEAD)) - 1
            request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                if response.status != 206:
                    raise ValueError(f"{self.url} answered a range request with status {response.status}")
                self._start, self._buffer = self.pos, response.read()
            self.requests += 1
        data = self._buffer[self.pos - self._start : self.pos - self._start + n]
        self.pos += len(data)
        return data


def wheel_url(dist: str, version: str, index_url: str = INDEX_URL,
              timeout: float = TIMEOUT_S) -> tuple[str, str]:
    """``(file name, URL)`` of a wheel of ``dist==version`` on a PEP 691 (JSON) index. The
    Python files are the same in every platform's wheel; x86-64 Linux is preferred."""
    request = urllib.request.Request(f"{index_url.rstrip('/')}/{dist}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        files = json.load(response).get("files", [])
    stem = dist.replace("-", "_")
    wheels = [f for f in files if f["filename"].startswith((f"{dist}-{version}-", f"{stem}-{version}-"))
              and f["filename"].endswith(".whl")]
    if not wheels:
        raise ValueError(f"the index lists no wheel of {dist}=={version}")
    wheels.sort(key=lambda f: ("x86_64" not in f["filename"], f["filename"]))
    return wheels[0]["filename"], wheels[0]["url"]


def source_dir(dist: str, version: str, cache: Path) -> Path:
    return cache / f"{dist}-{version}-src"


def read_members(dist: str, version: str, members: tuple[str, ...], cache: Path,
                 index_url: str = INDEX_URL, timeout: float = TIMEOUT_S) -> tuple[str, dict[str, bytes]]:
    """(wheel file name, {member: bytes}) for those of ``members`` the release's wheel has,
    from the cache or read off the index. Raises OSError, ValueError or
    ``zipfile.BadZipFile`` when the index cannot provide them."""
    target = source_dir(dist, version, cache)
    manifest = _manifest(target)
    if manifest is None or not set(members) <= set(manifest["looked_for"]):
        name, url = wheel_url(dist, version, index_url, timeout)
        with zipfile.ZipFile(RangeReader(url, timeout)) as archive:
            present = set(archive.namelist())
            looked_for = sorted(set(members) | set(manifest["looked_for"] if manifest else ()))
            found = [m for m in looked_for if m in present]
            for member in found:
                path = target / member
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(archive.read(member))  # zipfile raises on a CRC mismatch
        # Written last: a folder without it is an interrupted read and is read again.
        manifest = {"wheel": name, "looked_for": looked_for, "found": found}
        target.mkdir(parents=True, exist_ok=True)
        (target / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest["wheel"], {m: (target / m).read_bytes() for m in members if m in manifest["found"]}


def _manifest(target: Path) -> dict | None:
    try:
        return json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return None

