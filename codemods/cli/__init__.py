"""The command line: ``mm-schedule-codemod`` (``main``) and the libcst runner entry point."""

from .entry import main

__all__ = ["main"]
