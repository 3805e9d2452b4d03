"""Edits to import statements that keep the user's layout and comments.

An import's alias list is rebuilt from a chosen subset of aliases (split a statement)
or with aliases appended (merge into another statement). Each alias keeps the comment
that followed it; the closing parenthesis keeps its indentation, so no dangling ``)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from .resolve import dotted_expr, parent_and_base, relative_tail


def _multiline(node: cst.ImportFrom) -> bool:
    """One alias per line, the opening parenthesis ending its line (black's layout).
    A list that starts on the parenthesis line is rebuilt as a flat list."""
    if isinstance(node.names, cst.ImportStar) or node.lpar is None:
        return False
    return isinstance(node.lpar.whitespace_after, cst.ParenthesizedWhitespace)


def _own_comment(node: cst.ImportFrom, alias: cst.ImportAlias, is_last: bool):
    """The end-of-line text (comment) that follows ``alias`` in a multi-line list."""
    if isinstance(alias.comma, cst.Comma) and isinstance(
        alias.comma.whitespace_after, cst.ParenthesizedWhitespace
    ):
        return alias.comma.whitespace_after.first_line
    if is_last and node.rpar is not None and isinstance(
        node.rpar.whitespace_before, cst.ParenthesizedWhitespace
    ):
        return node.rpar.whitespace_before.first_line
    return cst.TrailingWhitespace()


def _layout(node: cst.ImportFrom) -> tuple[cst.SimpleWhitespace, cst.SimpleWhitespace]:
    """(item indentation, closing-parenthesis indentation) of a multi-line list."""
    item = cst.SimpleWhitespace("    ")
    lpar_ws = node.lpar.whitespace_after if node.lpar else None
    if isinstance(lpar_ws, cst.ParenthesizedWhitespace):
        item = lpar_ws.last_line
    last = node.names[-1]
    closing = cst.SimpleWhitespace("")
    if isinstance(last.comma, cst.Comma) and isinstance(
        last.comma.whitespace_after, cst.ParenthesizedWhitespace
    ):
        closing = last.comma.whitespace_after.last_line
    elif node.rpar is not None and isinstance(node.rpar.whitespace_before, cst.ParenthesizedWhitespace):
        closing = node.rpar.whitespace_before.last_line
    return item, closing


def _leading_lines(source: cst.ImportFrom, pos: int | None) -> Sequence[cst.EmptyLine]:
    """Comment lines written just above the alias at ``pos`` inside a multi-line list."""
    if pos is None:
        return ()
    if pos == 0:
        opening = source.lpar.whitespace_after if source.lpar is not None else None
        return opening.empty_lines if isinstance(opening, cst.ParenthesizedWhitespace) else ()
    prev = source.names[pos - 1].comma
    if isinstance(prev, cst.Comma) and isinstance(prev.whitespace_after, cst.ParenthesizedWhitespace):
        return prev.whitespace_after.empty_lines
    return ()


class _Positions:
    """Where each alias sits in the statement it came from; one table per statement, so
    rebuilding a list of n names costs n look-ups, not n scans."""

    def __init__(self) -> None:
        self._tables: dict[int, dict[int, int]] = {}

    def __call__(self, statement: cst.ImportFrom, alias: cst.ImportAlias) -> int | None:
        table = self._tables.get(id(statement))
        if table is None:
            table = self._tables[id(statement)] = {id(a): k for k, a in enumerate(statement.names)}
        return table.get(id(alias))


def with_aliases(
    node: cst.ImportFrom,
    entries: Sequence[tuple[cst.ImportAlias, cst.ImportFrom | None]],
) -> cst.ImportFrom:
    """``node`` importing exactly ``entries``: (alias, statement it came from or None).

    An alias whose successor is unchanged keeps its comma untouched; only the seams
    (a new last alias, appended aliases) are rebuilt, each keeping its own comment.
    """
    if not entries:
        raise ValueError("an import needs at least one name")
    last_original = node.names[-1]
    multiline = _multiline(node)
    item_indent, closing_indent = _layout(node) if multiline else (None, None)
    position = _Positions()
    out: list[cst.ImportAlias] = []
    for i, (alias, source) in enumerate(entries):
        source = source or node
        is_last = i == len(entries) - 1
        src_names = source.names
        src_pos = position(source, alias)
        if is_last and alias is last_original:
            out.append(alias)
            continue
        if (
            not is_last
            and source is node
            and src_pos is not None
            and src_pos + 1 < len(src_names)
            and src_names[src_pos + 1] is entries[i + 1][0]
        ):
            out.append(alias)
            continue
        if not multiline:
            comma = (
                cst.MaybeSentinel.DEFAULT
                if is_last
                else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
            out.append(alias.with_changes(comma=comma))
            continue
        comment = _own_comment(source, alias, src_pos == len(src_names) - 1)
        if is_last:
            whitespace = cst.ParenthesizedWhitespace(
                first_line=comment, indent=True, last_line=closing_indent
            )
        else:
            following, following_src = entries[i + 1]
            whitespace = cst.ParenthesizedWhitespace(
                first_line=comment,
                empty_lines=_leading_lines(following_src or node, position(following_src or node, following)),
                indent=True,
                last_line=item_indent,
            )
        out.append(alias.with_changes(comma=cst.Comma(whitespace_after=whitespace)))
    changes: dict = {"names": out}
    if multiline:
        # comment lines above the first name travel with it
        first, first_source = entries[0]
        opening = node.lpar.whitespace_after
        leading = _leading_lines(first_source or node, position(first_source or node, first))
        if list(leading) != list(opening.empty_lines):
            changes["lpar"] = node.lpar.with_changes(
                whitespace_after=opening.with_changes(empty_lines=leading)
            )
    if multiline and out[-1] is not last_original and node.rpar is not None:
        changes["rpar"] = node.rpar.with_changes(whitespace_before=cst.SimpleWhitespace(""))
    return node.with_changes(**changes)


def module_expr(module: str) -> cst.Name | cst.Attribute:
    return dotted_expr(module)


def retarget(node: cst.ImportFrom, new_module: str, package: str | None) -> cst.ImportFrom:
    """``node`` importing from ``new_module``, relative if ``node`` was and it can stay so."""
    tail = relative_tail(package, len(node.relative), new_module)
    if tail:
        return node.with_changes(module=dotted_expr(tail))
    return node.with_changes(module=dotted_expr(new_module), relative=())


def new_from_import(
    module: str, aliases: Sequence[tuple[str, str | None]], like: cst.ImportFrom | None,
    package: str | None,
) -> cst.ImportFrom:
    """A fresh ``from module import a, b as c`` in the style (relative or not) of ``like``."""
    names = []
    for i, (name, asname) in enumerate(aliases):
        names.append(
            cst.ImportAlias(
                name=cst.Name(name),
                asname=cst.AsName(name=cst.Name(asname)) if asname else None,
                comma=cst.MaybeSentinel.DEFAULT
                if i == len(aliases) - 1
                else cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
            )
        )
    node = cst.ImportFrom(module=dotted_expr(module), names=names)
    if like is not None and like.relative:
        node = retarget(node.with_changes(relative=like.relative), module, package)
    return node


def module_binding_import(
    module: str, name: str, like: cst.Import | cst.ImportFrom, package: str | None
) -> cst.Import | cst.ImportFrom:
    """A statement binding module object ``module`` to ``name``, in the style of ``like``."""
    parent, base = parent_and_base(module)
    if isinstance(like, cst.Import):
        asname = None if name == module else cst.AsName(name=cst.Name(name))
        return cst.Import(names=[cst.ImportAlias(name=dotted_expr(module), asname=asname)])
    alias = (base, None if name == base else name)
    if not parent:
        return cst.Import(names=[cst.ImportAlias(name=cst.Name(base),
                                                 asname=cst.AsName(name=cst.Name(name))
                                                 if name != base else None)])
    node = new_from_import(parent, [alias], None, package)
    tail = relative_tail(package, len(like.relative), parent)
    if tail is not None:
        node = node.with_changes(relative=like.relative, module=dotted_expr(tail) if tail else None)
    return node


def alias_binding(alias: cst.ImportAlias) -> str | None:
    """The name an alias binds in the importing scope."""
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    if isinstance(alias.name, cst.Name):
        return alias.name.value
    return None


def has_comments(node: cst.ImportFrom, aliases: Sequence[cst.ImportAlias]) -> bool:
    """Whether any of ``aliases`` has a comment after it or on a line above it in ``node``."""
    position = _Positions()
    for alias in aliases:
        pos = position(node, alias)
        if pos is None:
            continue
        own = _own_comment(node, alias, pos == len(node.names) - 1)
        if own.comment is not None or any(e.comment for e in _leading_lines(node, pos)):
            return True
    return False
