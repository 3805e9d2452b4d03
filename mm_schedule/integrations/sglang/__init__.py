"""SGLang integration: a whole stand-in for ``sglang.srt.managers.mm_schedule`` and the
calls that put it into a running engine.

* ``standin``: every module-level name of SGLang's module, for each release from 0.5.18
  to 0.5.23 (``standin.use_release``), run by mm_schedule.
* ``install()`` / ``uninstall()``: replace SGLang's module (and the references other
  loaded modules hold to it) in this process; an unknown release is verified first.
* ``differences`` / ``sglang_behaviour()``: the switches back to SGLang's behaviour.
* ``KNOWN`` / ``PROFILES``: the releases the stand-in knows, and each name's form in each.

See docs/sglang.md.
"""

from .differences import Differences, differences, sglang_behaviour
from .install import InstallReport, UnsupportedSGLangVersion, install, installed, uninstall
from .versions import KNOWN, PROFILES, Profile

__all__ = [
    "KNOWN", "PROFILES", "Differences", "InstallReport", "Profile", "UnsupportedSGLangVersion",
    "differences", "install", "installed", "sglang_behaviour", "uninstall",
]
