"""SGLang integration: a whole stand-in for ``sglang.srt.managers.mm_schedule`` and the
calls that put it into a running engine.

* ``standin``: every module-level name of SGLang 0.5.19's module, run by mm_schedule.
* ``install()`` / ``uninstall()``: replace SGLang's module (and the names other loaded
  modules took from it) in this process.
* ``differences`` / ``sglang_behaviour()``: the switches back to SGLang's behaviour.
* ``RELEASES``: which SGLang releases the stand-in matches.

See docs/sglang.md.
"""

from .differences import Differences, differences, sglang_behaviour
from .install import InstallReport, UnsupportedSGLangVersion, install, installed, uninstall
from .versions import MATCHED, RELEASES, Release

__all__ = [
    "MATCHED", "RELEASES", "Differences", "InstallReport", "Release", "UnsupportedSGLangVersion",
    "differences", "install", "installed", "sglang_behaviour", "uninstall",
]
