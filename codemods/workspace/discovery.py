"""Which files a run looks at, decided the way ruff decides.

Folders are walked for ``.py``, ``.pyi`` and ``.ipynb`` files. Left out, each with a
reason ``-v`` prints:

* inside a git repository (as git and ruff read them), what ``.gitignore`` files
  (the repository's, nested ones, negations), ``.git/info/exclude`` and the user's
  global git excludes file ignore; everywhere, what ``.ignore`` files ignore (ruff's
  and ripgrep's: also those in the folders above, and stronger than ``.gitignore``);
* virtual environments, recognised by their ``pyvenv.cfg`` (or ``conda-meta``), not
  by their name: a package called ``env`` or ``build`` is processed;
* tool and cache folders (``.git``, ``.tox``, ``__pycache__``, ``node_modules``, ...),
  replaced by ``exclude`` and extended by ``extend-exclude``;
* symlinked folders (not followed: no cycles, no walking out of the tree) and
  symlinks to files outside the folder being walked; a symlink to a file inside it
  stands for its target, which is processed once however many links point to it.

Exclude patterns come from the nearest ``[tool.mm-schedule-codemod]`` table, and a
folder inside the tree with its own table uses that one below it (as ruff does).
A file named on the command line is always processed (a symlink: its target is
written), unless ``force-exclude`` is set and an exclude pattern matches it.
Problems (a missing path, a broken link or a symlink loop, a folder or file that
cannot be looked at, a file name that is not UTF-8) are collected, each with its
failure code, never raised: discovery ends before the first file is read, and the
run then processes everything else and reports them.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..report.failures import Failure, os_reason
from .config import Config, config_in
from .regular_files import NotRegularFile, kind, read_regular

SUFFIXES = (".py", ".pyi", ".ipynb")
DEFAULT_EXCLUDE = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints",
    ".mypy_cache", ".nox", ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache",
    ".svn", ".tox", ".venv", ".vscode", "__pycache__", "__pypackages__", "_build", "buck-out",
    "node_modules", "site-packages",
)


@dataclass(frozen=True)
class Found:
    path: Path  # as reached (a link's own path when found through a symlink)
    real: Path  # the file that is read and written
    root: Path  # the path argument it was found under


@dataclass
class Discovery:
    files: list[Found] = field(default_factory=list)
    problems: list[tuple[str, Failure]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


# --- glob patterns ------------------------------------------------------------------------
def _glob_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):  # ``\ `` ``\*``: the next character as is
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif pattern[i] == "[" and pattern.find("]", i + 1) != -1:
            end = pattern.find("]", i + 1)
            out.append(fnmatch.translate(pattern[i : end + 1])[4:-3])
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern
    negate: bool
    dir_only: bool
    source: str


def _gitignore_rule(line: str, source: str) -> _Rule | None:
    line = line.rstrip("\r\n")
    kept = line.rstrip(" \t")
    if len(kept) < len(line) and (len(kept) - len(kept.rstrip("\\"))) % 2:
        kept += line[len(kept)]  # a trailing space escaped with a backslash stays (git's rule)
    line = kept
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    if line.startswith("\\"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    anchored = "/" in line
    body = _glob_regex(line.lstrip("/"))
    return _Rule(re.compile(("" if anchored else "(?:.*/)?") + body + "$"), negate, dir_only, source)


class _Ignore:
    """The ignore rules in force in one folder: its parents' first, then its own
    ``.gitignore`` (read only inside a git repository, as git and ruff read them), then
    its own ``.ignore`` (read everywhere, and stronger than ``.gitignore``, as ruff reads
    it). Later rules win; a folder's rules win over its parents'."""

    def __init__(self, parent: _Ignore | None, base: Path, rules: list[_Rule],
                 in_repo: bool = False) -> None:
        self.parent, self.base, self.rules, self.in_repo = parent, base, rules, in_repo
        self._prefix = os.fspath(base).rstrip(os.sep) + os.sep
        self._any = bool(rules) or (parent is not None and parent._any)

    def match(self, path: Path, is_dir: bool) -> _Rule | None:
        """The rule that ignores ``path``, or None if it is not ignored."""
        if not self._any:
            return None
        verdict = self.parent.match(path, is_dir) if self.parent else None
        text = os.fspath(path)
        if not self.rules or not text.startswith(self._prefix):
            return verdict
        rel = _posix(text[len(self._prefix):])
        for rule in self.rules:
            if (not rule.dir_only or is_dir) and rule.regex.match(rel):
                verdict = None if rule.negate else rule
        return verdict

    def child(self, folder: Path, enabled: bool = True) -> _Ignore:
        """The rules in force inside ``folder``, a folder below this one (or this one):
        these, then ``folder``'s ``.gitignore`` (inside a repository) and ``.ignore``."""
        if not enabled:
            return self
        in_repo = self.in_repo or os.path.exists(folder / ".git")
        ignore = self if in_repo == self.in_repo else _Ignore(self, folder, [], in_repo)
        if in_repo:
            ignore = ignore.with_file(folder, folder / ".gitignore")
        return ignore.with_file(folder, folder / ".ignore")

    def with_file(self, folder: Path, rules_file: Path) -> _Ignore:
        """These rules and those of ``rules_file``, whose patterns are relative to ``folder``."""
        try:
            lines = _text(rules_file).splitlines()
        except OSError:
            return self
        rules = [r for r in (_gitignore_rule(line, str(rules_file)) for line in lines) if r]
        return _Ignore(self, folder, rules, self.in_repo) if rules else self


def _text(path: Path) -> str:
    return read_regular(path)[0].decode("utf-8", errors="replace")


def _global_excludes() -> Path | None:
    """The user's git excludes file: ``core.excludesFile`` from the global git config,
    else git's default ``$XDG_CONFIG_HOME/git/ignore``."""
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "git"
    for config in (Path.home() / ".gitconfig", xdg / "config"):
        try:
            lines = _text(config).splitlines()
        except OSError:
            continue
        section = ""
        for line in lines:
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]").strip().lower()
            elif section == "core" and "=" in line:
                key, value = (part.strip() for part in line.split("=", 1))
                if key.lower() == "excludesfile" and value:
                    return Path(os.path.expanduser(value.strip('"')))
    return xdg / "ignore"


def repository_top(folder: Path) -> Path | None:
    """The top folder of the git repository ``folder`` is in (a ``.git`` folder, or the
    ``.git`` file of a worktree or submodule), or None."""
    return next((p for p in (folder, *folder.parents) if os.path.exists(p / ".git")), None)


def _ignore_for(folder: Path) -> _Ignore:
    """Rules in force in ``folder``, weakest first: the ``.ignore`` files of the folders
    above its repository (all of them outside one); inside a repository the user's global
    excludes file, ``info/exclude``, then each folder's ``.gitignore`` and ``.ignore``
    from the top down to ``folder``."""
    chain = [folder, *folder.parents]
    top = repository_top(folder)
    outside = chain if top is None else chain[chain.index(top) + 1:]
    ignore = _Ignore(None, folder, [])
    for part in reversed(outside):
        ignore = ignore.with_file(part, part / ".ignore")
    if top is None:
        return ignore
    ignore = _Ignore(ignore, top, [], in_repo=True)
    global_file = _global_excludes()
    if global_file is not None:
        ignore = ignore.with_file(top, global_file)
    if (top / ".git").is_dir():
        ignore = ignore.with_file(top, top / ".git" / "info" / "exclude")
    for part in reversed(chain[: chain.index(top) + 1]):
        ignore = ignore.child(part)
    return ignore


class _Excludes:
    """``exclude`` patterns: without a slash they match a file or folder name, with
    one a path relative to the folder that set them (like ruff's)."""

    def __init__(self, config: Config, cli_exclude, cli_extend) -> None:
        cwd = Path.cwd()
        base_patterns = cli_exclude if cli_exclude is not None else config.exclude
        default = base_patterns is None
        chosen = [(p, cwd if cli_exclude is not None else config.base)
                  for p in (base_patterns or DEFAULT_EXCLUDE)]
        chosen += [(p, config.base) for p in config.extend_exclude]
        chosen += [(p, cwd) for p in cli_extend]
        self.default = default
        self.names: list[tuple[re.Pattern, str]] = []
        self.paths: list[tuple[re.Pattern, str]] = []
        for pattern, base in chosen:
            clean = pattern.rstrip("/")
            if "/" in clean:
                full = (base / clean).as_posix() if not os.path.isabs(clean) else clean
                self.paths.append((re.compile(_glob_regex(full) + "$"), pattern))
            else:
                self.names.append((re.compile(_glob_regex(clean) + "$"), pattern))

        # one regex for the name patterns: most paths match none, and one search says so
        self._any_name = re.compile("|".join(f"(?:{r.pattern})" for r, _ in self.names) or "(?!)")

    def match(self, path: Path) -> str | None:
        name = path.name
        if self._any_name.match(name):
            for regex, pattern in self.names:
                if regex.match(name):
                    return pattern
        if self.paths:
            text = path.as_posix()
            for regex, pattern in self.paths:
                if regex.match(text):
                    return pattern
        return None


def _is_venv(folder: Path) -> bool:
    # os.path, unlike Path on Python < 3.14, answers False for what cannot be looked at.
    return os.path.isfile(folder / "pyvenv.cfg") or os.path.isdir(folder / "conda-meta")


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@dataclass
class _Level:
    """A folder being walked: its entries not yet taken, and what applies inside it."""

    entries: Iterator[os.DirEntry]
    real_folder: Path
    ignore: _Ignore
    excludes: _Excludes


class Walker:
    def __init__(self, config: Config, *, exclude=None, extend_exclude=(),
                 force_exclude: bool | None = None, respect_gitignore: bool | None = None) -> None:
        self.excludes = _Excludes(config, exclude, list(extend_exclude))
        self._cli_excludes = (exclude, list(extend_exclude))
        self.force_exclude = config.force_exclude if force_exclude is None else force_exclude
        self.gitignore = config.respect_gitignore if respect_gitignore is None else respect_gitignore
        self.result = Discovery()

    def add(self, raw: str) -> None:
        path = Path(raw)
        try:
            os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            self.result.problems.append((raw, Failure.of("path-not-found",
                                                         "no such file or folder")))
            return
        except OSError as exc:
            self.result.problems.append((raw, _link_problem(path, exc)))
            return
        try:
            real = Path(os.path.realpath(path, strict=True))
        except OSError as exc:
            self.result.problems.append((raw, _link_problem(path, exc)))
            return
        try:
            self._add(raw, path, real)
        except OSError as exc:  # e.g. a folder that can be listed but not searched
            self.result.problems.append((raw, _unreadable(exc, folder=os.path.isdir(real))))

    def _add(self, raw: str, path: Path, real: Path) -> None:
        if real.is_dir():
            folder = path.absolute()
            ignore = _ignore_for(real) if self.gitignore else _Ignore(None, real, [])
            self._walk(folder, real, ignore, folder)
            return
        mode = os.stat(real).st_mode
        if not stat.S_ISREG(mode):
            self.result.problems.append((raw, _unreadable(NotRegularFile(real, mode))))
            return
        if self.force_exclude:
            pattern = self._excluded_with_parents(path.absolute())
            if pattern:
                self.result.skipped.append((raw, f"matches exclude pattern {pattern!r} "
                                                 "(force-exclude)"))
                return
        self.result.files.append(Found(path, real, Path.cwd()))

    def _excluded_with_parents(self, path: Path) -> str | None:
        """The pattern excluding ``path`` or a folder it is in (below the working folder)."""
        cwd = Path.cwd()
        for candidate in (path, *path.parents):
            if candidate == cwd or (candidate != path and not _inside(candidate, cwd)):
                break
            pattern = self.excludes.match(candidate)
            if pattern:
                return pattern
        return None

    def _walk(self, folder: Path, real_folder: Path, ignore: _Ignore, root: Path) -> None:
        """Depth first, in name order, with a stack of its own rather than recursion: a tree
        can be nested deeper than Python's recursion limit."""
        outer = self.excludes
        stack: list[_Level] = []
        self._enter(folder, real_folder, ignore, root, stack)
        try:
            while stack:
                level = stack[-1]
                entry = next(level.entries, None)
                if entry is None:
                    stack.pop()
                    continue
                self.excludes = level.excludes
                try:
                    below = self._entry(entry, level.real_folder, level.ignore, root)
                    if below is not None:
                        self._enter(*below, root, stack)
                except OSError as exc:  # e.g. a folder that can be listed but not searched
                    self.result.problems.append(
                        (entry.path, _unreadable(exc, folder=_is_folder(entry))))
        finally:
            self.excludes = outer

    def _enter(self, folder: Path, real_folder: Path, ignore: _Ignore, root: Path,
               stack: list[_Level]) -> None:
        """Put ``folder``'s entries on the stack, with the excludes in force inside it."""
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
            # Listing needs read permission, looking at what is listed needs search
            # permission: a folder without it is one problem, not one per entry.
            os.stat(os.path.join(folder, os.curdir))
        except OSError as exc:
            self.result.problems.append((str(folder), _unreadable(exc, folder=True)))
            return
        nested = config_in(real_folder) if folder != root else None
        excludes = self.excludes if nested is None else _Excludes(nested, *self._cli_excludes)
        stack.append(_Level(iter(entries), real_folder, ignore, excludes))

    def _entry(self, entry: os.DirEntry, real_folder: Path,
               ignore: _Ignore, root: Path) -> tuple[Path, Path, _Ignore] | None:
        """Take one entry; a folder to walk into is returned (path, real path, rules)."""
        path = Path(entry.path)
        if entry.is_symlink():
            self._link(path, ignore, root)
        elif entry.is_dir(follow_symlinks=False):
            child = real_folder / entry.name
            reason = self._folder_skip(path, child, ignore)
            if reason:
                self.result.skipped.append((str(path), reason))
                return None
            return path, child, ignore.child(child, self.gitignore)
        elif entry.name.endswith(SUFFIXES) and entry.is_file(follow_symlinks=False):
            real = real_folder / entry.name
            reason = self._file_skip(path, real, ignore)
            if reason:
                self.result.skipped.append((str(path), reason))
            else:
                self.result.files.append(Found(path, real, root))
        elif entry.name.endswith(SUFFIXES):
            mode = entry.stat(follow_symlinks=False).st_mode
            self.result.skipped.append((str(path), f"{kind(mode)}, not a regular file (never opened)"))
        return None

    def _folder_skip(self, path: Path, real: Path, ignore: _Ignore) -> str | None:
        pattern = self.excludes.match(path)
        if pattern:
            return ("tool or cache folder" if self.excludes.default
                    else f"matches exclude pattern {pattern!r}")
        if _is_venv(real):
            return "virtual environment"
        rule = ignore.match(real, True)
        return f"ignored by {rule.source}" if rule else None

    def _file_skip(self, path: Path, real: Path, ignore: _Ignore) -> str | None:
        pattern = self.excludes.match(path)
        if pattern:
            return f"matches exclude pattern {pattern!r}"
        rule = ignore.match(real, False)
        return f"ignored by {rule.source}" if rule else None

    def _link(self, path: Path, ignore: _Ignore, root: Path) -> None:
        try:
            target = Path(os.path.realpath(path, strict=True))
        except OSError as exc:
            if path.name.endswith(SUFFIXES):
                self.result.problems.append((str(path), _link_problem(path, exc)))
            return
        if target.is_dir():
            self.result.skipped.append((str(path), "symlinked folder (not followed)"))
            return
        if not path.name.endswith(SUFFIXES):
            return
        mode = os.stat(target).st_mode
        if not stat.S_ISREG(mode):
            self.result.skipped.append((str(path), f"symlink to {kind(mode)}, not a file"))
            return
        if not _inside(target, Path(os.path.realpath(root))):
            self.result.skipped.append(
                (str(path), f"symlink to {target}, outside the tree (name it to migrate it)"))
            return
        reason = self._file_skip(path, path.parent.resolve() / path.name, ignore)
        if reason:
            self.result.skipped.append((str(path), reason))
        else:
            self.result.files.append(Found(path, target, root))


def _unreadable(exc: OSError, *, folder: bool = False) -> Failure:
    return Failure.of("unreadable", f"cannot read{' folder' if folder else ''}: {os_reason(exc)}")


def _link_problem(path: Path, exc: OSError) -> Failure:
    """Why the symlink ``path`` (or a link on the way to it) cannot be followed."""
    try:
        target = os.readlink(path)
    except OSError:  # not itself a link: a folder on the way is
        target = None
    if exc.errno == errno.ELOOP:
        where = f"it points to {target!r}, and following" if target is not None else "following"
        return Failure.of("symlink-loop", f"symlink loop: {where} the links never reaches a file")
    if not isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return _unreadable(exc)
    if target is None:
        return Failure.of("broken-symlink", "a symlink on the way to it leads nowhere")
    first = os.path.join(os.path.dirname(os.path.abspath(path)), target)
    if os.path.islink(first):  # a chain: name where it ends
        end = shown(Path(os.path.realpath(path)))
        return Failure.of("broken-symlink", f"broken symlink: it points to {target!r}, a link "
                                            f"that leads to {end!r}, which does not exist")
    return Failure.of("broken-symlink", f"broken symlink: it points to {target!r}, which does "
                                        "not exist")


def shown(path: Path) -> str:
    """A path as reports and diffs name it: relative to the working folder if inside it,
    else absolute."""
    text = os.fspath(path)
    if not os.path.isabs(text):
        return Path(text).as_posix()
    cwd = os.getcwd()
    for base in (_real_folder(cwd), cwd):
        if text == base:
            return "."
        if text.startswith(base.rstrip(os.sep) + os.sep):
            return _posix(text[len(base.rstrip(os.sep)) + 1:])
    return _posix(text)


def _posix(text: str) -> str:
    return text if os.sep == "/" else text.replace(os.sep, "/")


_REAL_FOLDERS: dict[str, str] = {}


def _real_folder(folder: str) -> str:
    """``folder`` with its symlinks resolved, remembered: every file of a run asks."""
    real = _REAL_FOLDERS.get(folder)
    if real is None:
        real = _REAL_FOLDERS[folder] = os.path.realpath(folder)
    return real


def excluded_stdin(path: Path, config: Config, **options) -> str | None:
    """The exclude pattern that leaves out source read from standard input under the name
    ``path`` (``--stdin-filename``); as for a file named on the command line, only with
    force-exclude."""
    walker = Walker(config, **options)
    return walker._excluded_with_parents(path.absolute()) if walker.force_exclude else None


def discover(paths, config_for, **options) -> Discovery:
    """Every file under ``paths``, each real file once; ``config_for(path)`` gives the
    settings in force for a path argument."""
    result = Discovery()
    seen: set[tuple[int, int]] = set()  # (device, inode): hard links are one file too
    for raw in paths:
        walker = Walker(config_for(Path(raw)), **options)
        walker.add(raw)
        result.problems += walker.result.problems
        result.skipped += walker.result.skipped
        for found in walker.result.files:
            if not _utf8(shown(found.real)):
                result.problems.append((str(found.real), Failure.of(
                    "undecodable-name", "file name is not valid UTF-8; not processed "
                                        "(a diff or a report could not name it)")))
                continue
            try:
                info = os.stat(found.real)
            except OSError as exc:
                result.problems.append((str(found.path), _unreadable(exc)))
                continue
            if (info.st_dev, info.st_ino) in seen:
                result.skipped.append((str(found.path), "same file as one already found "
                                                        "(processed once)"))
                continue
            seen.add((info.st_dev, info.st_ino))
            result.files.append(found)
    # dict: a path reached twice (walked, and named on the command line) is reported once
    result.problems = list(dict.fromkeys((shown(Path(p).absolute()), why)
                                         for p, why in result.problems))
    result.skipped = [(shown(Path(p).absolute()), why) for p, why in result.skipped]
    return result


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # surrogate escapes: bytes the file system encoding rejected
        return False
    return True
