"""Who answers ``import kernels`` where a source checkout's root is on ``sys.path``.

This folder is ``mm_schedule.kernels``. With a checkout's root on ``sys.path`` (``python -m
pytest`` or ``python -m mm_schedule.codemods`` run there, a notebook started there) Python
also finds it under the top-level name ``kernels``, which belongs to Hugging Face's
kernel-hub package: transformers imports that package whenever it is installed, and would
get this folder instead. ``__init__`` calls ``hand_over`` when it runs under that name.
"""

from __future__ import annotations

import os
import sys
import types
from importlib.machinery import ModuleSpec, PathFinder
from importlib.util import module_from_spec

NAME = "kernels"
CHECKOUT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def installed_spec(search_path: list[str], checkout_root: str = CHECKOUT_ROOT) -> ModuleSpec | None:
    """The spec of the ``kernels`` package that ``search_path`` holds outside ``checkout_root``."""
    root = os.path.realpath(checkout_root)
    elsewhere = [p for p in search_path if isinstance(p, str) and os.path.realpath(p or os.curdir) != root]
    return PathFinder.find_spec(NAME, elsewhere)


def hand_over() -> None:
    """Put the installed ``kernels`` package in ``sys.modules`` in place of this folder
    (``import kernels`` returns what ``sys.modules`` holds once the folder's ``__init__``
    has run), or a ``NotInstalled`` stand-in where there is none."""
    sys.modules.pop(__name__, None)  # this helper, loaded as kernels._top_level_name
    spec = installed_spec(sys.path)
    if spec is None:
        sys.modules[NAME] = NotInstalled(NAME)
        return
    module = module_from_spec(spec)
    sys.modules[NAME] = module
    spec.loader.exec_module(module)  # on failure the import machinery drops it from sys.modules


class NotInstalled(types.ModuleType):
    """``kernels`` where Hugging Face's package is not installed. Importing it must still
    succeed: transformers 5.x decides whether the package is installed by importing it and
    reading ``__version__`` and ``__file__`` (a stray folder lacks both), so every dunder
    is missing here and every other name raises ModuleNotFoundError saying what happened."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__spec__ = ModuleSpec(name, None)

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise ModuleNotFoundError(
            f"cannot use kernels.{attribute}: Hugging Face's kernels package is not installed"
            f" (pip install kernels), and the kernels/ folder in {CHECKOUT_ROOT} is this project's"
            " mm_schedule.kernels: import it under that name",
            name=NAME,
        )
