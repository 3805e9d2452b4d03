"""The move map: which names left a module, where they went, and how to treat them.

Kept as data (``maps/*.json``) so that the transform hard-codes no symbol and the
same codemod serves other module splits (``--map FILE``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

DEFAULT_MAP = "sglang_mm_schedule.json"


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
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed move map: {exc!r}") from exc

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
        }

    def destination(self, name: str) -> str | None:
        """The module a name imported from ``old_module`` should now come from, or None if it stays."""
        if name in self.moved:
            return self.new_module
        return self.import_origins.get(name)


def load_map(path: str | Path | None = None) -> MoveMap:
    if path is None:
        text = resources.files(__package__).joinpath("maps", DEFAULT_MAP).read_text("utf-8")
    else:
        text = Path(path).read_text("utf-8")
    return MoveMap.from_dict(json.loads(text))
