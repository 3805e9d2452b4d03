"""The move map: which names left a module, where they went, and how to treat them.

Kept as data (``maps/*.json``) so that the transform hard-codes no symbol and the
same codemod serves other module splits (``--map FILE``). ``derive.py`` produces the
maps from two versions of the module's source; nobody edits them by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

from ..errors import MoveMapError

DEFAULT_MAP = "sglang_mm_schedule.json"
KINDS = ("function", "class", "variable")


@dataclass(frozen=True)
class MovedName:
    kind: str  # "function" | "class" | "variable"
    private: bool


@dataclass(frozen=True)
class MoveMap:
    old_module: str
    new_module: str
    # Names defined in old_module that now live in new_module.
    moved: dict[str, MovedName]
    # Moved names that old_module still binds (re-exports); imports of them keep working,
    # but patches at the old look-up site no longer reach the code that uses them.
    reexported: frozenset[str]
    # Names old_module bound only by importing them and no longer binds -> their origin module.
    import_origins: dict[str, str]
    # Module globals rebound at run time (``global x; x = ...``); a from-import of them is stale.
    rebound_globals: frozenset[str]
    header: dict = field(default_factory=dict, compare=False)
    # Names defined in old_module that neither new file binds: nothing to rewrite to.
    removed: frozenset[str] = frozenset()
    # Names old_module bound only by an import that a plain ``from ORIGIN import name``
    # cannot reproduce (``import numpy as np``, ``from x import a as b``), no longer bound
    # there -> the statement that bound them, for a finding's message (reported, not edited).
    unmapped_imports: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, moved in self.moved.items():
            if moved.kind not in KINDS:
                raise MoveMapError(f"moved name {name!r} has kind {moved.kind!r}; expected one of {KINDS}")
        stray = sorted(self.reexported - self.moved.keys())
        if stray:
            raise MoveMapError(f"re-exported names must be moved names; not moved: {stray}")
        clash = sorted(self.moved.keys() & self.import_origins.keys())
        if clash:
            raise MoveMapError(f"names listed both as moved and as import-only: {clash}")

    @classmethod
    def from_dict(cls, data: dict) -> MoveMap:
        try:
            return cls(
                old_module=data["old_module"],
                new_module=data["new_module"],
                moved={k: MovedName(**v) for k, v in data["moved"].items()},
                reexported=frozenset(data.get("reexported", ())),
                import_origins=dict(data.get("import_origins", {})),
                rebound_globals=frozenset(data.get("rebound_globals", ())),
                header=dict(data.get("header", {})),
                removed=frozenset(data.get("removed", ())),
                unmapped_imports=dict(data.get("unmapped_imports", {})),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise MoveMapError(f"malformed move map: {exc!r}") from exc

    def to_dict(self) -> dict:
        return {
            "header": self.header,
            "old_module": self.old_module,
            "new_module": self.new_module,
            "moved": {
                k: {"kind": v.kind, "private": v.private} for k, v in sorted(self.moved.items())
            },
            "reexported": sorted(self.reexported),
            "import_origins": dict(sorted(self.import_origins.items())),
            "rebound_globals": sorted(self.rebound_globals),
            "removed": sorted(self.removed),
            "unmapped_imports": dict(sorted(self.unmapped_imports.items())),
        }

    def to_json(self) -> str:
        """The canonical text of a map file: what ``derive`` writes and ``--check`` compares."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @cached_property
    def gone(self) -> frozenset[str]:
        """Names the old module no longer binds and that have nowhere to be rewritten to."""
        return frozenset(self.removed) | frozenset(self.unmapped_imports)

    @cached_property
    def interesting(self) -> frozenset[str]:
        """Every name whose use through the old module needs an edit or a finding."""
        return frozenset(self.moved) | frozenset(self.import_origins) | self.gone

    def destination(self, name: str) -> str | None:
        """The module a name imported from ``old_module`` should now come from, or None if it stays."""
        if name in self.moved:
            return self.new_module
        return self.import_origins.get(name)


def load_map(path: str | Path | None = None) -> MoveMap:
    if path is None:
        text = resources.files(__package__).joinpath("maps", DEFAULT_MAP).read_text("utf-8")
        where = f"built-in map {DEFAULT_MAP}"
    else:
        try:
            text = Path(path).read_text("utf-8")
        except OSError as exc:
            raise MoveMapError(f"cannot read move map {path}: {exc.strerror or exc}") from exc
        where = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MoveMapError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MoveMapError(f"{where}: expected a JSON object, got {type(data).__name__}")
    try:
        return MoveMap.from_dict(data)
    except MoveMapError as exc:
        raise MoveMapError(f"{where}: {exc}") from exc
