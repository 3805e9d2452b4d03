"""``python -m mm_schedule.codemods.derive``, and the stable import path of the wheel cache
that the benchmarks share; the code lives in ``movemap/``."""

import sys

from .movemap.derive_cli import main
from .movemap.sources import default_wheel_cache

__all__ = ["default_wheel_cache", "main"]

if __name__ == "__main__":
    sys.exit(main())
