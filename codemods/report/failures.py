"""Why a path could not be processed: a stable code, like a finding's, and a message.

Failure codes live in their own range (``MMS9xx``), apart from the findings'
(``MMS0xx``): a finding is about code in a file that was processed, a failure means
the file (or folder) was not processed at all. Every failure makes the run exit 2;
every other file is still processed. Never renumber a code, only add new ones.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# code -> (short name, what it means). Listed in the JSON report and in the docs.
FAILURES: dict[str, tuple[str, str]] = {
    "MMS901": ("path-not-found", "a path named on the command line does not exist"),
    "MMS902": ("broken-symlink", "a symlink whose target does not exist"),
    "MMS903": ("symlink-loop", "a symlink that leads back to itself, directly or through other "
               "links"),
    "MMS904": ("unreadable", "a file or folder that cannot be read, listed or looked at "
               "(permissions, an I/O error)"),
    "MMS905": ("undecodable-name", "a file name that is not valid UTF-8; a diff or a report "
               "could not name it, so the file is not processed"),
    "MMS906": ("syntax-error", "a file that cannot be parsed (Python source, or a notebook's "
               "JSON)"),
    "MMS907": ("parser-crash", "a file that crashed the parser or exhausted its recursion limit "
               "or memory, or an internal error on that file"),
    "MMS908": ("timeout", "a file that took longer than --timeout to migrate"),
    "MMS909": ("unwritable", "a file whose new content could not be written; it is as it was"),
    "MMS910": ("changed-during-run", "a file that kept changing while it was migrated, or was "
               "removed; it keeps what was done to it meanwhile"),
    "MMS911": ("notebook-not-written", "a notebook whose JSON layout could not be reproduced; "
               "its findings are reported, the file is not written"),
}
_CODES = {name: code for code, (name, _) in FAILURES.items()}


@dataclass(frozen=True)
class Failure:
    """What went wrong with one path: ``code`` from ``FAILURES``, ``message`` the detail."""

    code: str
    message: str

    @classmethod
    def of(cls, name: str, message: str) -> Failure:
        """The failure named ``name`` (a short name in ``FAILURES``)."""
        return cls(_CODES[name], message)

    def render(self, path: str) -> str:
        """One line of text, shaped like a finding's: ``path: CODE [error] message``."""
        return f"{path}: {self.code} [error] {self.message}"

    def to_dict(self, path: str) -> dict:
        return {"path": path, "code": self.code, "error": self.message}


def os_reason(exc: OSError) -> str:
    """The operating system's words for ``exc`` (``Permission denied``), without the path."""
    return exc.strerror or str(exc)


_LIBCST_AT = re.compile(r"^(?:parser error: )?error at (\d+):(\d+): ")


def syntax_error_message(source: bytes, exc: Exception) -> str:
    """One position and one reason for a file that cannot be parsed: CPython's, when
    CPython cannot parse it either (its position is where the error is; libcst's is where
    its parser gave up, often a line later), else libcst's own."""
    try:
        ast.parse(source)
    except SyntaxError as error:
        if error.lineno:
            return f"cannot parse: line {error.lineno}, column {error.offset or 1}: {error.msg}"
        return f"cannot parse: {error.msg}"
    except (ValueError, MemoryError, RecursionError):
        pass
    message = str(getattr(exc, "message", None) or exc).strip()
    at = _LIBCST_AT.match(message)
    if at:
        line, column = int(at.group(1)), int(at.group(2)) + 1
        message = message[at.end():]
    elif hasattr(exc, "raw_line"):
        line, column = exc.raw_line, exc.raw_column + 1
    else:
        return f"cannot parse: {message}"
    return f"cannot parse: line {line}, column {column}: {message}"
