"""The move map: which names left a module, where they went, and how to treat them.

Kept as data (``maps/*.json``) so that the transform hard-codes no symbol and the
same codemod serves other module splits (``--map FILE``). ``derive.py`` produces the
maps from two versions of the module's source; nobody edits them by hand.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from pathlib import Path

from ...errors import MoveMapError

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

    # Re-exported names -> the modules whose own code looks them up (from the newer
    # release): patching the name where it is looked up is what reaches those callers.
    # A name absent here is assumed to be looked up in new_module only.
    looked_up_in: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Names old_module bound in releases before this map's range and that neither module
    # binds any more -> where they were last seen. Reported only when a caller asks for
    # this map's target release (``load_map(..., target_version=...)``).
    earlier: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for role, module in (("old_module", self.old_module), ("new_module", self.new_module)):
            _check_module(module, role)
        if self.old_module == self.new_module:
            raise MoveMapError(f"new_module is the same as old_module ({self.old_module!r})")
        for name, moved in self.moved.items():
            _check_name(name, "moved")
            if not isinstance(moved, MovedName) or moved.kind not in KINDS or not isinstance(moved.private, bool):
                raise MoveMapError(f"moved name {name!r}: expected kind in {KINDS} and a boolean "
                                   f"'private', got {moved!r}")
        for role, names in (("reexported", self.reexported), ("rebound_globals", self.rebound_globals),
                            ("removed", self.removed), ("unmapped_imports", self.unmapped_imports),
                            ("import_origins", self.import_origins), ("earlier", self.earlier),
                            ("looked_up_in", self.looked_up_in)):
            for name in names:
                _check_name(name, role)
        for name, origin in self.import_origins.items():
            _check_module(origin, f"import_origins[{name!r}]")
            if origin == self.old_module:
                raise MoveMapError(f"import_origins[{name!r}] is the old module itself; a name "
                                   "cannot move to where it already is")
        for name, modules in self.looked_up_in.items():
            for module in modules:
                _check_module(module, f"looked_up_in[{name!r}]")
        stray = sorted(self.reexported - self.moved.keys())
        if stray:
            raise MoveMapError(f"re-exported names must be moved names; not moved: {stray}")
        stray = sorted(self.looked_up_in.keys() - self.reexported)
        if stray:
            raise MoveMapError(f"looked_up_in lists names that are not re-exported: {stray}")
        groups = (("moved", set(self.moved)), ("import_origins", set(self.import_origins)),
                  ("removed", set(self.removed)), ("unmapped_imports", set(self.unmapped_imports)),
                  ("earlier", set(self.earlier)))
        for i, (first, a) in enumerate(groups):
            for second, b in groups[i + 1 :]:
                if (first, second) == ("removed", "earlier"):
                    continue  # a map aimed at its target release reports earlier names as removed
                clash = sorted(a & b)
                if clash:
                    raise MoveMapError(f"names listed both as {first} and as {second}: {clash}")

    @classmethod
    def from_dict(cls, data: dict) -> MoveMap:
        if not isinstance(data, dict):
            raise MoveMapError(f"expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise MoveMapError(f"unknown keys {unknown}; expected some of {sorted(_FIELDS)}")
        for key in ("old_module", "new_module", "moved"):
            if key not in data:
                raise MoveMapError(f"missing required key {key!r}")
        moved = _typed(data, "moved", dict)
        for name, entry in moved.items():
            if not isinstance(entry, dict) or set(entry) != {"kind", "private"}:
                raise MoveMapError(f"moved[{name!r}]: expected {{'kind': ..., 'private': ...}}, got {entry!r}")
        return cls(
            old_module=_typed(data, "old_module", str),
            new_module=_typed(data, "new_module", str),
            moved={k: MovedName(**v) for k, v in moved.items()},
            reexported=frozenset(_strings(data, "reexported")),
            import_origins=_string_map(data, "import_origins"),
            rebound_globals=frozenset(_strings(data, "rebound_globals")),
            header=dict(_typed(data, "header", dict, {})),
            removed=frozenset(_strings(data, "removed")),
            unmapped_imports=_string_map(data, "unmapped_imports"),
            looked_up_in={k: tuple(v) for k, v in _typed(data, "looked_up_in", dict, {}).items()
                          if _all_strings(v, f"looked_up_in[{k!r}]")},
            earlier=_string_map(data, "earlier"),
        )

    def for_target(self, version: str) -> MoveMap:
        """This map for a user who moves straight to ``version``, the release the map was
        derived for: names the old module lost before the map's range are reported too."""
        target = self.header.get("target_version")
        if target is None:
            raise MoveMapError("this map does not record the release it targets (no "
                               "header.target_version); derive it from released archives")
        if version != target:
            raise MoveMapError(f"this map targets {self.header.get('distribution', 'release')} {target}, "
                               f"not {version}; derive a map for {version}")
        return replace(self, removed=self.removed | frozenset(self.earlier))

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
            "looked_up_in": {k: list(v) for k, v in sorted(self.looked_up_in.items())},
            "earlier": dict(sorted(self.earlier.items())),
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


def load_map(path: str | Path | None = None, *, target_version: str | None = None) -> MoveMap:
    """The map in ``path`` (default: the shipped SGLang map), validated. Raises
    ``MoveMapError`` naming the file and the entry that is wrong. With ``target_version``
    (the release the user moves to) names removed before the map's range are reported too."""
    if path is None:
        text = resources.files(__package__.rpartition(".")[0]).joinpath("maps", DEFAULT_MAP).read_text("utf-8")
        where = f"built-in map {DEFAULT_MAP}"
    else:
        try:
            text = Path(path).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise MoveMapError(f"cannot read move map {path}: {reason}") from exc
        where = str(path)
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise MoveMapError(f"{where} is not valid JSON: {exc}") from exc
    except MoveMapError as exc:
        raise MoveMapError(f"{where}: {exc}") from exc
    try:
        move_map = MoveMap.from_dict(data)
        return move_map.for_target(target_version) if target_version else move_map
    except MoveMapError as exc:
        raise MoveMapError(f"{where}: {exc}") from exc


_FIELDS = {"header", "old_module", "new_module", "moved", "reexported", "import_origins",
           "rebound_globals", "removed", "unmapped_imports", "looked_up_in", "earlier"}
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_module(module, role: str) -> None:
    if (not isinstance(module, str) or not _MODULE.fullmatch(module)
            or any(keyword.iskeyword(part) for part in module.split("."))):
        raise MoveMapError(f"{role}: {module!r} is not a dotted module name")


def _check_name(name, role: str) -> None:
    # A keyword matches the pattern but cannot be imported: rewritten code would not parse.
    if not isinstance(name, str) or not _NAME.fullmatch(name) or keyword.iskeyword(name):
        raise MoveMapError(f"{role}: {name!r} is not a Python name")


def _typed(data: dict, key: str, kind: type, default=None):
    value = data.get(key, default)
    if not isinstance(value, kind):
        raise MoveMapError(f"{key}: expected a {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _all_strings(values, role: str) -> bool:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise MoveMapError(f"{role}: expected a list of strings, got {values!r}")
    if len(set(values)) != len(values):
        raise MoveMapError(f"{role}: lists an entry twice: {values!r}")
    return True


def _strings(data: dict, key: str) -> list[str]:
    values = _typed(data, key, list, [])
    _all_strings(values, key)
    return values


def _string_map(data: dict, key: str) -> dict[str, str]:
    value = _typed(data, key, dict, {})
    for name, text in value.items():
        if not isinstance(text, str):
            raise MoveMapError(f"{key}[{name!r}]: expected a string, got {text!r}")
    return dict(value)


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise MoveMapError(f"key {key!r} appears twice (contradictory entries)")
        out[key] = value
    return out
