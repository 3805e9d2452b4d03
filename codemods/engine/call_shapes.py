"""The calls whose arguments the rules read (patch targets, setattr/getattr names, dynamic
imports, ``sys.modules`` slots), by their dotted name: one list for the libcst collector
and for the large-file scanner, which plans such a call as a whole."""

from __future__ import annotations

_SYS_MODULES_CALLS = frozenset({"sys.modules.setdefault", "sys.modules.pop", "sys.modules.get"})


def call_kind(name: str) -> str | None:
    """What a call named ``name`` (``mock.patch.object``) is to the rules, or None when
    its arguments do not matter: ``setattr`` (the builtin), ``getattr`` (and ``hasattr``),
    ``import``, ``patch``, ``object``, ``dict`` (``patch.dict``), ``module-slot``,
    ``multiple`` or ``monkeypatch`` (``monkeypatch.setattr`` and the like)."""
    last = name.rsplit(".", 1)[-1]
    if name in ("setattr", "delattr"):
        return "setattr"
    if name in ("getattr", "hasattr"):
        return "getattr"
    if last in ("import_module", "__import__"):
        return "import"
    if last == "patch":
        return "patch"
    if name.endswith("patch.object"):
        return "object"
    if name.endswith("patch.dict"):
        return "dict"
    if name in _SYS_MODULES_CALLS:
        return "module-slot"
    if name.endswith("patch.multiple"):
        return "multiple"
    if last in ("setattr", "delattr"):
        return "monkeypatch"
    return None
