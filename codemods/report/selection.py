"""Which finding codes a run acts on: ``select`` / ``ignore`` / ``extend-select``, as ruff
resolves them.

A selector is ``ALL``, a code (``MMS004``) or a prefix of codes (``MMS``, ``MMS0``,
``MMS00``). The settings file is read first, the command line after it; each layer that
sets ``select`` starts again from what it selects, a layer without one changes what the
layer before left. Inside a layer the less specific selectors apply first, so the more
specific one wins (``--select MMS0 --ignore MMS004``, ``--ignore MMS0 --extend-select
MMS004``), and at the same specificity ``ignore`` wins. A code that is off by default is
left out of the default selection only: any selector that matches it turns it on.

A code that is not selected is neither reported nor acted on: the rules leave its uses
as they are, as for a suppressed code.

An optional code (a rewrite that is a tidy-up, such as one of a name the old module
still re-exports) is in the default selection, so ``--write`` applies it and ``--check``
shows it, but it fails ``--check`` only once a selector that matches it (``ALL``, a
prefix, the code) selects it; ``--ignore`` drops it like any other code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

ALL = "ALL"


class SelectionError(ValueError):
    """A selector that names no code."""


@dataclass(frozen=True)
class Layer:
    """One source of settings: ``select`` None means "keep what came before"."""

    select: Sequence[str] | None = None
    extend_select: Sequence[str] = ()
    ignore: Sequence[str] = ()
    source: str = "command line"


def _specificity(selector: str) -> int:
    return -1 if selector == ALL else len(selector)


def _matching(selector: str, codes: Iterable[str], source: str) -> set[str]:
    selector = selector.strip()
    if selector.upper() == ALL:
        return set(codes)
    found = {code for code in codes if code.startswith(selector.upper())}
    if not found or not selector:
        raise SelectionError(f"{source}: unknown rule selector {selector!r} (expected ALL, a "
                             "code such as MMS001, or a prefix of codes such as MMS0)")
    return found


@dataclass(frozen=True)
class Selection:
    """The codes a run acts on, and those of them that do not fail ``--check`` (optional
    codes no selector named)."""

    codes: frozenset[str]
    lenient: frozenset[str] = frozenset()


def resolve(layers: Sequence[Layer], codes: Mapping[str, object] | Iterable[str],
            off_by_default: Iterable[str] = (), optional: Iterable[str] = ()) -> Selection:
    """The selection after ``layers`` (weakest first); raises ``SelectionError`` for a
    selector that matches no code in ``codes``."""
    codes = sorted(codes)
    selected = set(codes) - set(off_by_default)
    named: set[str] = set()  # selected by a selector rather than by default
    for layer in layers:
        if layer.select is not None:
            selected, named = set(), set()
        chosen = [(s, True) for s in (*(layer.select or ()), *layer.extend_select)]
        chosen += [(s, False) for s in layer.ignore]
        # stable sort: by specificity, then selections before ignores of the same one
        chosen.sort(key=lambda item: (_specificity(item[0].strip().upper()), not item[1]))
        for selector, add in chosen:
            matched = _matching(selector, codes, layer.source)
            if add:
                selected |= matched
                named |= matched
            else:
                selected -= matched
                named -= matched
    return Selection(frozenset(selected), frozenset(selected & set(optional) - named))
