"""Which vLLM releases the integration matches, and how another one is verified in place.

The integration reads vLLM's own objects (``MultiModalFeatureSpec.identifier`` /
``.mm_position`` / ``.modality``, ``PlaceholderRange(offset, length, is_embed)``, the
model runner's ``num_computed_tokens`` and scheduled-token counts) and reproduces the
rows of its gather and the result of its merge. ``SUPPORTED_RELEASES`` are the releases
whose own code it was compared with, side by side, from their wheels.

The first entry point that runs reads the installed version from the package metadata
(``importlib.metadata``). A listed release is used as it is. Any other one (newer than
the list, a pre-release, a fork's build) is verified where it runs, once per process:
the probe of ``verify`` runs that vLLM's own gather and merge against ours on a few
random steps of CPU tensors (a fraction of a second). When every result agrees, the
release is accepted with one logged warning; otherwise every entry point raises
``UnsupportedVLLMRelease`` naming the first difference. Only then is vLLM imported (its
multimodal structures, its merge and its runner modules, which the worker process holds
already). ``accept_release`` accepts a release without the probe.

Without vLLM installed nothing is checked: the objects passed in are then the caller's
own, with vLLM's attribute names.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
from importlib import metadata

from .errors import UnsupportedVLLMRelease

# Releases whose own gather and merge this integration was compared with, bit for bit.
SUPPORTED_RELEASES = ("0.34.0", "0.33.0", "0.32.0", "0.31.0", "0.30.0", "0.29.0", "0.28.0", "0.27.1", "0.26.0",
                      "0.25.1")
PROBE_CASES = 24  # random steps the probe of an unlisted release runs (fp32 and bf16 alternating)

logger = logging.getLogger("mm_schedule.integrations.vllm")

_accepted: set[str] = set()
_UNCHECKED = object()
_verdict: object = _UNCHECKED  # the installed release, None (no vLLM) or the refusal, once decided
_lock = threading.RLock()
_probing = threading.local()  # set in the thread running the probe, whose own calls go through


def release_of(version: str) -> str:
    """``major.minor.patch`` of a version string: ``0.33.0+cu129`` -> ``0.33.0``. A
    pre-release or development build (``0.34.0rc1``, ``0.33.1.dev5+g1234``) is kept as
    it is: it is not the release it precedes."""
    match = re.fullmatch(r"(\d+\.\d+\.\d+)(\+.*)?", version.strip())
    return match.group(1) if match else version.strip()


def check_release(version: str) -> str:
    """Return ``version``'s release when it is listed or accepted, else raise
    ``UnsupportedVLLMRelease`` naming the listed ones (no probe: see ``verify_release``)."""
    release = release_of(version)
    if release in SUPPORTED_RELEASES or release in _accepted:
        return release
    raise UnsupportedVLLMRelease(
        f"vLLM {version} is not a release mm_schedule's vLLM integration was compared with"
        f" (compared: {', '.join(SUPPORTED_RELEASES)}). Run `python -m mm_schedule.integrations.vllm.verify`"
        " against it; if every case matches, call"
        f" mm_schedule.integrations.vllm.accept_release({release!r}) before the first step"
    )


def accept_release(version: str) -> None:
    """Treat ``version`` as verified in this process, without the probe."""
    global _verdict
    with _lock:
        _accepted.add(release_of(version))
        _verdict = _UNCHECKED


def forget_installed_check() -> None:
    """Make the next entry point read the installed version (and probe it) again."""
    global _verdict
    with _lock:
        _verdict = _UNCHECKED


def installed_version() -> str | None:
    """The installed vLLM's version from its package metadata, or None."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def installed_release_checked() -> str | None:
    """Called by every entry point: the installed release, decided once (see the module
    docstring); raises ``UnsupportedVLLMRelease`` while the installed one is refused."""
    verdict = _verdict
    if verdict is _UNCHECKED:
        if getattr(_probing, "active", False):
            return None  # the probe's own calls of our functions
        with _lock:
            if _verdict is _UNCHECKED:
                _decide()
            verdict = _verdict
    if isinstance(verdict, UnsupportedVLLMRelease):
        # A copy per raise: tracebacks and contexts of concurrent callers stay their own.
        raise copy.copy(verdict)
    return verdict


def _decide() -> None:
    global _verdict
    version = installed_version()
    if version is None or release_of(version) in SUPPORTED_RELEASES or release_of(version) in _accepted:
        _verdict = None if version is None else release_of(version)
        return
    try:
        from .verify import from_installed

        code, skipped = from_installed()
    except Exception as exc:  # an installation whose modules do not import cannot be verified
        _verdict = UnsupportedVLLMRelease(
            f"vLLM {version} is not a release mm_schedule's vLLM integration was compared with, and its"
            f" multimodal modules could not be imported to verify it ({type(exc).__name__}: {exc})")
        return
    try:
        _verdict = verify_release(code, installed=version, skipped=skipped)
    except UnsupportedVLLMRelease as exc:
        _verdict = exc


def verify_release(code, *, installed: str | None = None, skipped: tuple[str, ...] | list[str] = ()) -> str:
    """Run the probe on ``code`` (a ``verify.VllmCode``: that vLLM's structures and
    functions) and accept its release when every result agrees with ours, logging one
    warning; else raise ``UnsupportedVLLMRelease`` naming the first difference."""
    from .verify import run_cases

    version = installed or code.version
    release = release_of(version)
    _probing.active = True
    try:
        n, problems = run_cases(code, PROBE_CASES, seed=0)
    except Exception as exc:  # a probe step that raises (vLLM's side or ours) is a difference too
        problems = [f"a probe step raised {type(exc).__name__}: {exc}"]
        n = 0
    finally:
        _probing.active = False
    if problems:
        raise UnsupportedVLLMRelease(
            f"vLLM {version} is not a release mm_schedule's vLLM integration was compared with, and on the"
            f" probe's random steps its own gather and merge differ from this integration's: {problems[0]}"
            + (f" (and {len(problems) - 1} more differences)" if len(problems) > 1 else "")
            + ". Keep vLLM's own functions for this release")
    with _lock:
        _accepted.add(release)
    not_compared = f"; not compared: {', '.join(skipped)}" if skipped else ""
    logger.warning("vLLM %s is not a release mm_schedule's vLLM integration was compared with; its own gather"
                   " and merge agreed with this integration's on %d random probe steps, so it is accepted%s",
                   version, n, not_compared)
    return release
