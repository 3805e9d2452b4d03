"""Rule: from-import statements that name the old module (or a rebound global of the new one).

Each name in a from-import of the old module goes to its destination without
disturbing the user's layout: it merges into an earlier from-import of that destination
in the same block if there is one, otherwise the statement itself is retargeted (when
no name stays behind) or a new statement follows it. A statement is merged away only
if that loses no comment. A shim written for both versions
(``try: from new import x`` / ``except ImportError: from old import x``) is left alone.

The rule walks the from-imports once, in source order. What it looks up on the way (the
sorter blocks, the imports each block has of each module, the names waiting to join a
statement) lives in tables built once per file and kept current, so a file of thousands
of one-name imports costs thousands of steps, not millions.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from dataclasses import dataclass, field

import libcst as cst

from ..engine.collect import ImportSite
from ..engine.edits import Edits
from ..engine.imports import alias_binding, has_comments, new_from_import, retarget, with_aliases
from ..engine.migration import Migration
from ..engine.resolve import dotted_name
from ..fastpath.scan import Scan
from .rebound import plan_rebound
from .rule import Rule


def plan_from_imports(m: Migration) -> None:
    """Send each name a from-import of the old module binds to its destination; in
    from-imports of the new module only rebound globals need work."""
    facts, edits = m.facts, m.edits
    move_map = facts.map
    rebound = move_map.rebound_globals
    plan = _Plan.start(m)
    for site in list(facts.sites):
        node = site.node
        if not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
            continue
        if site.protected:
            edits.kept_sites.add(id(site))
            continue
        if site.module == facts.new and rebound:
            removed = {
                id(alias) for alias in node.names
                if isinstance(alias.name, cst.Name) and alias.name.value in rebound
                and _take_out_rebound(plan, site, alias)
            }
            if removed:
                _split(plan, site, [], removed)
            continue
        if site.module != facts.old:
            continue
        moving: list[tuple[cst.ImportAlias, str]] = []
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else None
            dest = move_map.destination(name) if name else None
            if dest and m.held(alias, move_code(move_map, name)):
                continue  # a suppressed name stays where it is
            if dest:
                moving.append((alias, dest))
            elif name in move_map.gone:
                report_gone(m, alias, name)
        if not moving or _is_compatible_shim(m, site, moving):
            if moving:
                edits.kept_sites.add(id(site))
            continue
        removed = set()
        for alias, _dest in moving:
            if alias.name.value in rebound and _take_out_rebound(plan, site, alias):
                removed.add(id(alias))
        _split(plan, site, [(a, d) for a, d in moving if id(a) not in removed], removed)
    plan.build_merges()


def _take_out_rebound(plan: _Plan, site: ImportSite, alias: cst.ImportAlias) -> bool:
    plan.build_merges()  # the rebound rule reads (and may extend) the planned statements
    return plan_rebound(plan.m, site, alias)


def _is_compatible_shim(m: Migration, site: ImportSite, moving: list[tuple[cst.ImportAlias, str]]) -> bool:
    """``try: from new import x`` / ``except ImportError: from old import x``: leave it."""
    if site.try_ctx is None or site.try_ctx[1] == "other":
        return False
    try_node, side = site.try_ctx
    others = [
        s for s in m.facts.sites
        if s.try_ctx is not None and s.try_ctx[0] is try_node and s.try_ctx[1] not in (side, "other")
        and isinstance(s.node, cst.ImportFrom)
    ]
    if not others:
        return False
    for alias, dest in moving:
        bound = alias_binding(alias)
        if not any(
            s.module == dest and not isinstance(s.node.names, cst.ImportStar)
            and any(alias_binding(a) == bound for a in s.node.names)
            for s in others
        ):
            return False
    return True


def _split(plan: _Plan, site: ImportSite, moving: list[tuple[cst.ImportAlias, str]], removed: set[int]) -> None:
    """Move the ``moving`` aliases to their destinations and drop the ``removed`` ones.
    With nothing staying, the statement itself takes the first destination (or merges
    away); every other destination merges into an earlier import of it in the same
    block or gets a statement of its own right after this one."""
    m = plan.m
    edits, package = m.edits, m.facts.package
    node = site.node
    assert isinstance(node, cst.ImportFrom)
    plan.build_merge(node)  # names merged into this statement earlier stay with it
    moving_ids = {id(a) for a, _ in moving}
    staying = [a for a in edits.current(node).names if id(a) not in moving_ids | removed]
    groups: dict[str, list[cst.ImportAlias]] = {}
    for alias, dest in moving:
        groups.setdefault(dest, []).append(alias)
        report_move(m, alias, alias.name.value, dest, "import")
    if not groups:
        if removed:
            if staying:
                edits.statements[node] = with_aliases(edits.current(node), [(a, None) for a in staying])
            else:
                plan.delete(site)
        return
    order = list(groups)
    run = plan.runs.get(id(site))
    if not staying:
        if run is not None:
            order.sort(key=lambda dest: not run.fits(edits, site, _retargeted_key(m, site, dest)))
        first = order.pop(0)
        target = _merge_target(plan, site, first)
        if target is not None and _removable(site):
            _merge_into(plan, target, groups[first], node)
            plan.delete(site)
        else:
            current = edits.current(node)
            if removed or order:
                current = with_aliases(current, [(a, None) for a in groups[first]])
            edits.statements[node] = retarget(current, first, package)
            plan.retarget(site, first)
    else:
        edits.statements[node] = with_aliases(edits.current(node), [(a, None) for a in staying])
    for dest in order:
        target = _merge_target(plan, site, dest)
        if target is not None:
            _merge_into(plan, target, groups[dest], node)
        else:
            statement = retarget(with_aliases(node, [(a, None) for a in groups[dest]]), dest, package)
            if statement.lpar is not None and not has_comments(node, groups[dest]):
                # a short split-off list without comments reads better on one line
                flat = new_from_import(dest, [(a.name.value, alias_binding(a) if a.asname else None)
                                              for a in groups[dest]], node, package)
                if _width(flat) <= LINE_LENGTH:
                    statement = flat
            _place(plan, site, run, _wrapped(statement))


def _removable(site: ImportSite) -> bool:
    """A statement may be merged away only if that loses no comment or neighbour."""
    line = site.line
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return False
    if line.trailing_whitespace.comment is not None:
        return False
    if any(e.comment is not None for e in line.leading_lines):
        return False
    node = site.node
    return not any(
        isinstance(a.comma, cst.Comma)
        and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)
        and (a.comma.whitespace_after.first_line.comment is not None
             or any(e.comment for e in a.comma.whitespace_after.empty_lines))
        for a in node.names
    ) and not (
        node.rpar is not None
        and isinstance(node.rpar.whitespace_before, cst.ParenthesizedWhitespace)
        and node.rpar.whitespace_before.first_line.comment is not None
    )


def _merge_target(plan: _Plan, site: ImportSite, dest: str) -> ImportSite | None:
    """An earlier ``from dest import ...`` in the same block, or one in the same run of
    import lines (no code between, so the name is bound before any use), to add names to."""
    run = plan.runs.get(id(site))
    reach = run.members[-1].index if run is not None else site.index - 1
    return plan.last_import_of(site, dest, reach)


def _merge_into(plan: _Plan, target: ImportSite, aliases: list[cst.ImportAlias], source: cst.ImportFrom) -> None:
    """Add to ``target`` the aliases it lacks; each keeps its comment from ``source``."""
    merge = plan.merges.get(target.node)
    if merge is None:
        merge = plan.merges[target.node] = _Merge(plan.m.edits.current(target.node))
    if merge.add(aliases, source) and merge.wraps:
        # it was one line that fitted: rebuilt now, it takes black's layout the moment
        # it outgrows the line, and names merged later follow that layout
        plan.build_merge(target.node)


@dataclass(eq=False)
class _Merge:
    """Names on their way into one from-import. The statement is rebuilt once with all
    of them (``build``) rather than once per name: a file of N one-name imports merged
    into one statement would otherwise cost N rebuilds of a growing statement."""

    statement: cst.ImportFrom  # as planned when the first of these names arrived
    entries: list[tuple[cst.ImportAlias, cst.ImportFrom | None]] = field(init=False)
    present: set[tuple[str, str | None]] = field(init=False)
    keys: list[tuple[int, str]] | None = field(init=False)  # member keys; None: unsorted names
    wraps: bool = field(init=False)  # a one-line statement that still fits the line
    grown: bool = False

    def __post_init__(self) -> None:
        names = self.statement.names
        self.entries = [(a, None) for a in names]
        self.present = {(a.name.value, alias_binding(a)) for a in names if isinstance(a.name, cst.Name)}
        self.keys = [member_key(a.name.value) for a in names] if _members_sorted(names) else None
        self.wraps = self.statement.lpar is None and _width(self.statement) <= LINE_LENGTH

    def add(self, aliases: list[cst.ImportAlias], source: cst.ImportFrom) -> bool:
        """Take the aliases not imported yet, each where isort would put it when the
        names are sorted, else at the end; whether any was new."""
        grew = False
        for alias in aliases:
            key = (alias.name.value, alias_binding(alias))
            if key in self.present:
                continue
            self.present.add(key)
            grew = True
            if self.keys is None:
                self.entries.append((alias, source))
                continue
            order = member_key(alias.name.value)
            at = bisect_right(self.keys, order)
            self.keys.insert(at, order)
            self.entries.insert(at, (alias, source))
        self.grown |= grew
        return grew

    def build(self) -> cst.ImportFrom:
        merged = with_aliases(self.statement, self.entries)
        return _wrapped(merged) if self.wraps else merged


# -- where new statements go --------------------------------------------------------
# Files kept sorted by isort or ruff's I001 stay sorted: a new from-import goes where
# the sorter would put it inside the block of from-imports around the original, and a
# merged name where it would sort among the names. Unsorted code keeps the old rule
# (right after the original statement).
LINE_LENGTH = 88  # black's and ruff's default; a longer new import is wrapped


def member_key(name: str) -> tuple[int, str]:
    """isort's order of imported names: CONSTANTS, then Classes, then everything else."""
    if len(name) > 1 and name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def _members_sorted(names) -> bool:
    keys = [member_key(a.name.value) for a in names if isinstance(a.name, cst.Name)]
    return len(keys) == len(names) and keys == sorted(keys)


def _written(node: cst.ImportFrom) -> str:
    return "." * len(node.relative) + (dotted_name(node.module) or "" if node.module else "")


def _module_key(text: str) -> str:
    return text.lower()


def _planned_key(edits: Edits, site: ImportSite) -> str:
    return _module_key(_written(edits.current(site.node)))


def _retargeted_key(m: Migration, site: ImportSite, dest: str) -> str:
    return _module_key(_written(retarget(site.node, dest, m.facts.package)))


def _starts_section(site: ImportSite) -> bool:
    line = site.line
    return not isinstance(line, cst.SimpleStatementLine) or any(e.comment is None for e in line.leading_lines)


def _sorted_runs(sites: list[ImportSite]) -> dict[int, _Run | None]:
    """For each one-statement from-import line, keyed by site id: the from-imports on
    the lines around it with no blank line between them (one sorter block), if their
    modules are in sorted order; else None."""
    lines: dict[int, dict[int, ImportSite]] = {}
    for s in sites:
        if isinstance(s.node, cst.ImportFrom) and isinstance(s.line, cst.SimpleStatementLine) and len(s.line.body) == 1:
            lines.setdefault(id(s.block), {})[s.index] = s
    runs: dict[int, _Run | None] = {}
    for by_index in lines.values():
        members: list[ImportSite] = []
        for index in sorted(by_index):
            s = by_index[index]
            if members and (members[-1].index != index - 1 or _starts_section(s)):
                _add_run(runs, members)
                members = []
            members.append(s)
        _add_run(runs, members)
    return runs


def _add_run(runs: dict[int, _Run | None], members: list[ImportSite]) -> None:
    keys = [_module_key(_written(s.node)) for s in members]
    run = _Run(members, keys) if keys == sorted(keys) else None
    for s in members:
        runs[id(s)] = run


class _Run:
    """One sorted sorter block. Sites are planned in source order and only a site's own
    planning retargets or deletes it, so while a member is planned, the members before
    it are settled and those after it are as written (so, sorted)."""

    def __init__(self, members: list[ImportSite], written_keys: list[str]) -> None:
        self.members = members
        self.written_keys = written_keys
        self._position = {id(s): k for k, s in enumerate(members)}
        self._settled = 0  # members before this position are folded into the two lists below
        self._kept: list[ImportSite] = []  # the settled members that were not deleted
        self._ceiling: list[str] = []  # the highest module key among _kept[: k + 1]

    def _settle(self, edits: Edits, site: ImportSite) -> int:
        k = self._position[id(site)]
        assert k >= self._settled, "from-imports of a run must be planned in source order"
        for member in self.members[self._settled : k]:
            if member.node not in edits.deleted:
                key = _planned_key(edits, member)
                self._ceiling.append(max(key, self._ceiling[-1]) if self._ceiling else key)
                self._kept.append(member)
        self._settled = k
        return k

    def fits(self, edits: Edits, site: ImportSite, key: str) -> bool:
        """Whether ``site`` reading from a module with sort key ``key`` keeps the run sorted."""
        k = self._settle(edits, site)
        after = self.written_keys[k + 1 : k + 2]
        return (not self._ceiling or self._ceiling[-1] <= key) and (not after or key <= after[0])

    def follower(self, edits: Edits, site: ImportSite, key: str) -> ImportSite | None:
        """The first member left in the run whose module sorts after ``key``, if any."""
        k = self._settle(edits, site)
        # the running maximum first exceeds ``key`` at the first member that does
        before = bisect_right(self._ceiling, key)
        if before < len(self._ceiling):
            return self._kept[before]
        if site.node not in edits.deleted and _planned_key(edits, site) > key:
            return site
        after = bisect_right(self.written_keys, key, lo=k + 1)
        return self.members[after] if after < len(self.members) else None


def _place(plan: _Plan, site: ImportSite, run: _Run | None, statement: cst.ImportFrom) -> None:
    edits = plan.m.edits
    if run is None:
        edits.split_off.setdefault(site.node, []).append(statement)
        return
    follower = run.follower(edits, site, _module_key(_written(statement)))
    if follower is not None:
        edits.placed_before.setdefault(follower.node, []).append(statement)
        return
    # after the last member (``site`` itself when it is the last, even if merged away)
    edits.split_off.setdefault(run.members[-1].node, []).append(statement)


@dataclass(eq=False)
class _Plan:
    """What the rule keeps while it walks the from-imports in source order: the sorter
    blocks, the from-imports each block still has of each module (to merge names into),
    and the names waiting to join them."""

    m: Migration
    runs: dict[int, _Run | None]
    # (block id, module) -> from-imports that read from it as planned, in source order
    imports_of: dict[tuple[int, str | None], list[ImportSite]]
    order: dict[int, int]  # site id -> position among the file's sites
    merges: dict[cst.CSTNode, _Merge] = field(default_factory=dict)

    @classmethod
    def start(cls, m: Migration) -> _Plan:
        sites = m.facts.sites
        imports_of: dict[tuple[int, str | None], list[ImportSite]] = {}
        for s in sites:
            if isinstance(s.node, cst.ImportFrom) and not isinstance(s.node.names, cst.ImportStar):
                imports_of.setdefault((id(s.block), m.edits.module_of(s)), []).append(s)
        return cls(m, _sorted_runs(sites), imports_of, {id(s): k for k, s in enumerate(sites)})

    def _where(self, site: ImportSite) -> tuple[int, int]:
        return (site.index, self.order[id(site)])

    def last_import_of(self, site: ImportSite, module: str, reach: int) -> ImportSite | None:
        """The last from-import of ``module`` other than ``site`` in its block, on a line
        up to ``reach``, that is neither deleted nor kept as written."""
        found = self.imports_of.get((id(site.block), module), [])
        end = bisect_right(found, (reach, len(self.order)), key=self._where)
        kept = self.m.edits.kept_sites
        for other in reversed(found[:end]):
            if other is not site and id(other) not in kept:
                return other
        return None

    def delete(self, site: ImportSite) -> None:
        self.m.edits.deleted.add(site.node)
        self.imports_of[(id(site.block), self.m.edits.module_of(site))].remove(site)

    def retarget(self, site: ImportSite, module: str) -> None:
        edits = self.m.edits
        self.imports_of[(id(site.block), edits.module_of(site))].remove(site)
        edits.retargeted[site.node] = module
        insort(self.imports_of.setdefault((id(site.block), module), []), site, key=self._where)

    def build_merge(self, node: cst.CSTNode) -> None:
        merge = self.merges.pop(node, None)
        if merge is not None and merge.grown:
            self.m.edits.statements[node] = merge.build()

    def build_merges(self) -> None:
        for node in list(self.merges):
            self.build_merge(node)


def _width(statement: cst.ImportFrom) -> int:
    return len(cst.Module(body=[]).code_for_node(statement))


def _wrapped(statement: cst.ImportFrom) -> cst.ImportFrom:
    """``statement`` in black's parenthesised layout when it is longer than a line."""
    if statement.lpar is not None or isinstance(statement.names, cst.ImportStar):
        return statement
    if _width(statement) <= LINE_LENGTH:
        return statement
    item = cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace("    "))
    names = [
        alias.with_changes(comma=cst.Comma(whitespace_after=item if i < len(statement.names) - 1
                                           else cst.ParenthesizedWhitespace(indent=True)))
        for i, alias in enumerate(statement.names)
    ]
    return statement.with_changes(
        names=names,
        lpar=cst.LeftParen(whitespace_after=item),
        rpar=cst.RightParen(),
    )


# The codes of a use of a name the map covers. From-imports are where such names are
# met first; the attribute and call rules report the uses they rewrite through
# ``report_move`` and ``report_gone`` too, so a name gets one code however it is reached.
CODES = {
    "MMS001": ('moved-name', 'name moved to the new module; reference rewritten'),
    "MMS002": ('moved-private', 'private name moved to the new module; rewritten, but it is private there and its signature may change between releases'),
    "MMS003": ('import-origin', 'the old module only imported this name and no longer binds it; rewritten to its origin module'),
    "MMS004": ('stale-global', 'from-import of a module global that is rebound at run time; the imported value goes stale'),
    "MMS009": ('removed-name', 'name was removed from the old module and has no new home'),
    "MMS010": ('unmapped-import', 'the old module bound this name by an import a plain from-import cannot reproduce; bind it yourself'),
    "MMS017": ('reexported-name', 'name moved to the new module, which the old module still re-exports; reference rewritten (optional: fails --check only when a selector names it)'),
}

# A rewrite of a name the old module still re-exports (``from new import name`` there) is a
# tidy-up, not a fix: the old import keeps working. ``--write`` applies it and ``--check``
# shows it, failing on it only when a selector names the code (``report.selection``).
# Patches of such names are another matter (the old site no longer reaches callers in the
# new module): the call and attribute rules give those their own codes.
REEXPORTED = "MMS017"


def move_code(move_map, name: str) -> str:
    """The code a rewrite of ``name`` is reported with."""
    if name in move_map.import_origins and name not in move_map.moved:
        return "MMS003"
    if name in move_map.reexported:
        return REEXPORTED
    return "MMS002" if move_map.moved[name].private else "MMS001"


def report_move(m: Migration, node: cst.CSTNode, name: str, dest: str, how: str) -> None:
    """A rewrite of ``name`` to ``dest``, worded by what kind of move it is."""
    move_map = m.facts.map
    old = move_map.old_module
    code = move_code(move_map, name)
    if code == "MMS003":
        message = f"{how}: {old} only imported {name!r}; now from its origin {dest}"
    elif code == REEXPORTED:
        message = (f"{how}: {name!r} moved to {dest}; {old} still re-exports it, so this "
                   "rewrite is optional")
    elif code == "MMS002":
        message = (f"{how}: private {name!r} moved to {dest}; it is private there and may "
                   "change without notice")
    else:
        message = f"{how}: {name!r} moved to {dest}"
    m.report(node, code, name, message, True)


def report_gone(m: Migration, node: cst.CSTNode, name: str) -> None:
    """A use of a name the old module no longer binds and that has no new home."""
    move_map = m.facts.map
    old = move_map.old_module
    statement = move_map.unmapped_imports.get(name)
    if statement is not None:
        m.report(node, "MMS010", name, f"{old} no longer binds {name!r}; it came from "
                 f"'{statement}', bind it the same way here", False)
    elif name in move_map.earlier:
        m.report(node, "MMS009", name, f"{name!r} is gone from {old}: "
                 f"{move_map.earlier[name]}; rewrite this use by hand", False)
    else:
        m.report(node, "MMS009", name, f"{name!r} was removed from {old} and has no "
                 "new home; rewrite this use by hand", False)


def trigger(scan: Scan) -> bool:
    facts = scan.facts
    return any(
        (module == facts.old and not names.isdisjoint(facts.interesting))
        or (module in facts.rebound_sources and not names.isdisjoint(facts.rebound))
        for module, names in scan.from_imports
    )


RULE = Rule('from-imports', plan_from_imports, trigger, CODES, optional=frozenset({REEXPORTED}))
