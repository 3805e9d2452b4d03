"""Which vLLM releases the integration matches, and the check that refuses the others.

The integration reads vLLM's own objects (``MultiModalFeatureSpec.identifier`` /
``.mm_position``, ``PlaceholderRange(offset, length, is_embed)``, the model runner's
``num_computed_tokens`` and scheduled-token counts) and reproduces the rows of its
gather and the result of its merge. That is only known to hold for the releases whose
own code it was compared with, side by side (``python -m
mm_schedule.integrations.vllm.verify``); they are listed here. Another installed
release is refused with ``UnsupportedVLLMRelease`` the first time an entry point runs,
until ``accept_release`` says it has been verified.

The installed version is read from the package metadata (``importlib.metadata``): vLLM
itself is never imported for it. Without vLLM installed nothing is refused: the objects
passed in are then the caller's own, with vLLM's attribute names.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

from .errors import UnsupportedVLLMRelease

# Releases whose own gather and merge this integration was compared with, bit for bit.
SUPPORTED_RELEASES = ("0.33.0", "0.32.0", "0.31.0", "0.30.0", "0.29.0", "0.28.0", "0.27.1", "0.26.0", "0.25.1")

_accepted: set[str] = set()


def release_of(version: str) -> str:
    """``major.minor.patch`` of a version string: ``0.33.0+cu129`` -> ``0.33.0``. A
    pre-release or development build (``0.34.0rc1``, ``0.33.1.dev5+g1234``) is kept as
    it is: it is not the release it precedes."""
    match = re.fullmatch(r"(\d+\.\d+\.\d+)(\+.*)?", version.strip())
    return match.group(1) if match else version.strip()


def check_release(version: str) -> str:
    """Return ``version``'s release when the integration matches it, else raise
    ``UnsupportedVLLMRelease`` naming the supported ones."""
    release = release_of(version)
    if release in SUPPORTED_RELEASES or release in _accepted:
        return release
    raise UnsupportedVLLMRelease(
        f"vLLM {version} is not a release mm_schedule's vLLM integration was checked against"
        f" (supported: {', '.join(SUPPORTED_RELEASES)}). Run `python -m mm_schedule.integrations.vllm.verify`"
        " against it; if every case matches, call"
        f" mm_schedule.integrations.vllm.accept_release({release!r}) before the first step"
    )


def accept_release(version: str) -> None:
    """Treat ``version`` as supported in this process (after verifying it)."""
    _accepted.add(release_of(version))
    installed_release_checked.cache_clear()


def installed_version() -> str | None:
    """The installed vLLM's version from its package metadata, or None."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def installed_release_checked() -> str | None:
    """Run once, by the first entry point called: the installed release, checked."""
    version = installed_version()
    return None if version is None else check_release(version)
