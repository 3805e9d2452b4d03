"""Settings from a ``[tool.mm-schedule-codemod]`` table in ``pyproject.toml``.

Found the way ruff finds its own: the nearest ``pyproject.toml`` that has the table,
looking from the path being processed up to the file system root (files without the
table are passed over); a folder inside the walked tree with its own table uses that
one for everything below it. Keys::

    [tool.mm-schedule-codemod]
    exclude = ["generated/"]        # replaces the built-in folder list
    extend-exclude = ["*_pb2.py"]   # adds to it
    respect-gitignore = true
    force-exclude = false           # apply the excludes to files named on the command line
    map = "migrations/map.json"     # relative to the pyproject.toml
    acknowledge-fork = false        # settle MMS015: this fork's own old module was checked
    select = ["ALL"]                # the codes to act on (default: all but the off-by-default)
    extend-select = ["MMS016"]      # more codes on top of select
    ignore = ["MMS005"]             # codes left alone

Command-line options win over the file.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import MMScheduleError
from .regular_files import read_regular

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

TABLE = "mm-schedule-codemod"
_KEYS = {"exclude", "extend-exclude", "respect-gitignore", "force-exclude", "map", "acknowledge-fork",
         "select", "extend-select", "ignore"}


class ConfigError(MMScheduleError, ValueError):
    """A ``[tool.mm-schedule-codemod]`` table cannot be read or holds a wrong value."""


@dataclass(frozen=True)
class Config:
    source: Path | None = None  # the pyproject.toml, None when there is none
    exclude: tuple[str, ...] | None = None
    extend_exclude: tuple[str, ...] = ()
    respect_gitignore: bool = True
    force_exclude: bool = False
    map: str | None = None
    acknowledge_fork: bool = False
    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    base: Path = field(default_factory=Path.cwd)  # folder that patterns are relative to


def _strings(value, key: str, where: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: [tool.{TABLE}] {key} must be a list of strings")
    return tuple(value)


def _flag(value, key: str, where: Path) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: [tool.{TABLE}] {key} must be true or false")
    return value


def _table(pyproject: Path) -> dict | None:
    try:
        raw, _ = read_regular(pyproject)
    except OSError as exc:
        raise ConfigError(f"cannot read {pyproject}: {exc.strerror or exc}") from exc
    if f"tool.{TABLE}".encode() not in raw and f'"{TABLE}"'.encode() not in raw:
        return None
    if tomllib is None:
        raise ConfigError(f"{pyproject}: reading [tool.{TABLE}] needs Python 3.11 or later")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject} is not valid TOML: {exc}") from exc
    table = data.get("tool", {}).get(TABLE)
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.{TABLE}] must be a table")
    return table


def config_in(folder: Path) -> Config | None:
    """The settings of ``folder/pyproject.toml``, or None if it has no table."""
    pyproject = folder / "pyproject.toml"
    try:
        if not stat.S_ISREG(os.stat(pyproject).st_mode):
            return None
    except (FileNotFoundError, NotADirectoryError):
        return None  # any other OSError: a folder that cannot be searched, for the caller
    table = _table(pyproject)
    if table is None:
        return None
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(f"{pyproject}: unknown key(s) in [tool.{TABLE}]: {unknown}; "
                          f"expected some of {sorted(_KEYS)}")
    map_path = table.get("map")
    if map_path is not None and not isinstance(map_path, str):
        raise ConfigError(f"{pyproject}: [tool.{TABLE}] map must be a string")
    return Config(
        source=pyproject,
        exclude=_strings(table["exclude"], "exclude", pyproject) if "exclude" in table else None,
        extend_exclude=_strings(table.get("extend-exclude", []), "extend-exclude", pyproject),
        respect_gitignore=_flag(table.get("respect-gitignore", True), "respect-gitignore", pyproject),
        force_exclude=_flag(table.get("force-exclude", False), "force-exclude", pyproject),
        map=str(folder / map_path) if map_path else None,
        acknowledge_fork=_flag(table.get("acknowledge-fork", False), "acknowledge-fork", pyproject),
        select=_strings(table["select"], "select", pyproject) if "select" in table else None,
        extend_select=_strings(table.get("extend-select", []), "extend-select", pyproject),
        ignore=_strings(table.get("ignore", []), "ignore", pyproject),
        base=folder,
    )


def find_config(start: Path) -> Config:
    """The settings in force for ``start`` (a file or a folder)."""
    start = start.absolute()
    folder = start if os.path.isdir(start) else start.parent
    for candidate in (folder, *folder.parents):
        try:
            found = config_in(candidate)
        except OSError:  # a folder that cannot be searched: nothing below it is reachable,
            continue  # and discovery reports the path itself
        if found is not None:
            return found
    return Config()
