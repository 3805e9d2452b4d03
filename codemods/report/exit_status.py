"""The codemod's exit statuses, shared by the migration command and ``derive``."""

from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_REMAINING, EXIT_FAILED, EXIT_USAGE = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143
EXIT_STATUS_HELP = """\
exit status:
  0    nothing left to do
  1    changes or findings remain (--check, --diff), or findings that need a
       person remain (--write)
  2    some paths could not be processed, and every other file was: each is
       listed with its MMS9xx code (a missing path, a broken or looping symlink,
       an unreadable file or folder, a file name that is not UTF-8, a file that
       cannot be parsed, crashes the parser, times out, cannot be written or
       keeps changing during the run)
  3    the run did not start and no file was read or written: a bad option, an
       empty path, a malformed move map or [tool.mm-schedule-codemod] table, a
       --json path that cannot be written
  130  interrupted (Ctrl-C)
  143  terminated (SIGTERM)
       (either way each file is as it was or fully migrated)
"""


class UsageParser(argparse.ArgumentParser):
    """An argument parser whose usage errors exit with ``EXIT_USAGE``: nothing was touched."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class UsageError(Exception):
    """The command line or its inputs are wrong; nothing has been touched."""
