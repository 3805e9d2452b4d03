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
    # Names old_module bound in other releases and that it lacks in the target release ->
    # which release last had them (for the finding's message). Filled in by ``for_target``.
    earlier: dict[str, str] = field(default_factory=dict)
    # Every release the map covers, oldest first, and for each of the two modules the
    # names it bound in them: ``{"old_module": {name: ((first, last), ...)}, "new_module":
    # ...}``, runs of consecutive releases. ``for_target`` reads them to aim the map at
    # any one release.
    releases: tuple[str, ...] = ()
    lifetimes: dict[str, dict[str, tuple[tuple[str, str], ...]]] = field(default_factory=dict)
    # The release ``for_target`` aimed this map at (None: the map as its file has it).
    aimed_at: str | None = field(default=None, compare=False)

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
        self._check_lifetimes()
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

    def _check_lifetimes(self) -> None:
        unknown = sorted(set(self.lifetimes) - {"old_module", "new_module"})
        if unknown:
            raise MoveMapError(f"lifetimes: unknown keys {unknown}; expected old_module, new_module")
        order = {release: i for i, release in enumerate(self.releases)}
        for role, table in self.lifetimes.items():
            for name, runs in table.items():
                _check_name(name, f"lifetimes[{role!r}]")
                for run in runs:
                    if (len(run) != 2 or any(r not in order for r in run)
                            or order[run[0]] > order[run[1]]):
                        raise MoveMapError(f"lifetimes[{role!r}][{name!r}]: {list(run)} is not a "
                                           "run of releases this map lists, oldest first")

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
            releases=tuple(_strings(data, "releases")),
            lifetimes=_lifetimes(data),
        )

    def for_target(self, version: str) -> MoveMap:
        """This map for a user who moves straight to ``version``: what the two modules bind
        in that release decides. A name the old module still binds needs nothing (a
        re-export, when the new module has it too); a moved name the new module lost is
        removed; a name the old module bound in an earlier release and lacks in this one
        is removed, its message naming the last release that had it. Before the split
        (the new module binds nothing yet) nothing is rewritten."""
        if not self.releases:
            target = self.header.get("split_version")
            if target is None:
                raise MoveMapError("this map does not record the releases it covers (no "
                                   "'releases'); derive it from released archives")
            if version != target:
                raise MoveMapError(f"this map covers {self._dist} {target} only, not {version}; "
                                   "derive it with --history to cover more releases")
            return replace(self, removed=self.removed | frozenset(self.earlier), aimed_at=version)
        if version not in self.releases:
            raise MoveMapError(f"{self._dist} {version} is not a release this map covers "
                               f"({self.releases[0]} to {self.releases[-1]})")
        at = self.releases.index(version)
        old_life = self.lifetimes.get("old_module", {})
        new_life = self.lifetimes.get("new_module", {})

        def bound(table, name: str) -> bool:
            return any(self._index(a) <= at <= self._index(b) for a, b in table.get(name, ()))

        def last_before(table, name: str) -> str | None:
            ends = [b for a, b in table.get(name, ()) if self._index(b) < at]
            return max(ends, key=self._index) if ends else None

        def note(last: str) -> str:
            return f"last in {self._dist} {last} (gone since {self.releases[self._index(last) + 1]})"

        before_split = bool(new_life) and not any(bound(new_life, name) for name in new_life)
        moved, reexported = dict(self.moved), set(self.reexported)
        origins, removed = dict(self.import_origins), set(self.removed)
        unmapped, earlier = dict(self.unmapped_imports), {}
        for name in list(moved):
            in_old, in_new = bound(old_life, name), bound(new_life, name)
            if in_new:
                if in_old:
                    reexported.add(name)
                continue
            del moved[name]
            reexported.discard(name)
            last = None if in_old or before_split else last_before(new_life, name)
            if last is not None:  # the new module had it, and lost it again
                removed.add(name)
                earlier[name] = f"it moved to {self.new_module}, which had it {note(last)}"
        for table in (origins, unmapped):
            # before the split the base release's origins are unknown ground: a name the
            # old module lacks then is reported below like any other
            for name in [n for n in table if before_split or bound(old_life, n)]:
                del table[name]
        removed -= {n for n in removed if bound(old_life, n)}
        for name in old_life:
            if name in moved or name in origins or name in unmapped or bound(old_life, name):
                continue
            last = last_before(old_life, name)
            if last is not None and name not in earlier:
                removed.add(name)
                earlier[name] = note(last)
        return replace(
            self, moved=moved, reexported=frozenset(reexported), import_origins=origins,
            removed=frozenset(removed), unmapped_imports=unmapped, earlier=dict(sorted(earlier.items())),
            rebound_globals=self.rebound_globals & frozenset(moved),
            looked_up_in={k: v for k, v in self.looked_up_in.items() if k in reexported},
            aimed_at=version,
        )

    @property
    def _dist(self) -> str:
        return self.header.get("distribution", "release")

    def _index(self, release: str) -> int:
        return self._order[release]

    @cached_property
    def _order(self) -> dict[str, int]:
        return {release: i for i, release in enumerate(self.releases)}

    @property
    def newest(self) -> str | None:
        """The newest release the map covers (what a run aims at by default)."""
        return self.releases[-1] if self.releases else None

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
            **({"earlier": dict(sorted(self.earlier.items()))} if self.earlier else {}),
            **({"releases": list(self.releases)} if self.releases else {}),
            **({"lifetimes": {role: {name: [list(run) for run in runs]
                                     for name, runs in sorted(table.items())}
                              for role, table in sorted(self.lifetimes.items())}}
               if self.lifetimes else {}),
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

    def sparing(self, names: set[str]) -> MoveMap:
        """This map with ``names`` no longer reported as gone (a fork's own old module
        still binds them)."""
        return replace(self, removed=self.removed - names,
                       unmapped_imports={k: v for k, v in self.unmapped_imports.items() if k not in names},
                       earlier={k: v for k, v in self.earlier.items() if k not in names})

    def destination(self, name: str) -> str | None:
        """The module a name imported from ``old_module`` should now come from, or None if it stays."""
        if name in self.moved:
            return self.new_module
        return self.import_origins.get(name)


def load_map(path: str | Path | None = None, *, target_version: str | None = None,
             aimed: bool = True) -> MoveMap:
    """The map in ``path`` (default: the shipped SGLang map), validated, aimed at
    ``target_version`` (the release the user moves to; default the newest the map covers,
    see ``MoveMap.for_target``). ``aimed=False``: the map as the file has it. Raises
    ``MoveMapError`` naming the file and the entry that is wrong."""
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
        target = (target_version or move_map.newest) if aimed else None
        return move_map.for_target(target) if target else move_map
    except MoveMapError as exc:
        raise MoveMapError(f"{where}: {exc}") from exc


_FIELDS = {"header", "old_module", "new_module", "moved", "reexported", "import_origins",
           "rebound_globals", "removed", "unmapped_imports", "looked_up_in", "earlier",
           "releases", "lifetimes"}
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


def _lifetimes(data: dict) -> dict[str, dict[str, tuple[tuple[str, str], ...]]]:
    value = _typed(data, "lifetimes", dict, {})
    out = {}
    for role, table in value.items():
        if not isinstance(table, dict):
            raise MoveMapError(f"lifetimes[{role!r}]: expected an object, got {table!r}")
        out[role] = {}
        for name, runs in table.items():
            if not isinstance(runs, list) or not all(
                    isinstance(run, list) and all(isinstance(r, str) for r in run) for run in runs):
                raise MoveMapError(f"lifetimes[{role!r}][{name!r}]: expected a list of "
                                   f"[first, last] releases, got {runs!r}")
            out[role][name] = tuple(tuple(run) for run in runs)
    return out


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise MoveMapError(f"key {key!r} appears twice (contradictory entries)")
        out[key] = value
    return out
