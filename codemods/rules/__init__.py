"""The rules: plain functions of a ``Migration``, run in the order of ``RULES``.

Each rule is one file that owns its finding codes, its planning function and its
fast-path trigger (``rule.Rule``); adding a rule is adding its file and one line below.
The order matters: attribute and call rewrites reach modules through the imports as the
from-import rule left them, the string rule skips strings a call accounted for, and
pruning needs every rewritten use.
"""

from __future__ import annotations

from ..report import suppression
from . import (
    calls,
    doc_references,
    fork,
    from_imports,
    module_attributes,
    module_slots,
    prune_bindings,
    star_imports,
    strings,
)
from .rule import Rule, merge_codes

RULES: tuple[Rule, ...] = (
    from_imports.RULE,
    module_attributes.RULE,
    calls.RULE,
    module_slots.RULE,
    star_imports.RULE,
    doc_references.RULE,
    strings.RULE,
    prune_bindings.RULE,
)

# Every finding code, with its short name and meaning (``--json`` reports, docs). The
# fork and unused-suppression codes are settled outside a file's rules: for the whole
# tree, and once the rules have used or not used each suppression.
CODES = merge_codes(*(rule.codes for rule in RULES), fork.CODES, suppression.CODES)
OFF_BY_DEFAULT = frozenset().union(*(rule.off_by_default for rule in RULES),
                                   suppression.OFF_BY_DEFAULT)
# Acted on by default, failing --check only when a selector names them.
OPTIONAL = frozenset().union(*(rule.optional for rule in RULES))
# What a run acts on when nothing is selected.
DEFAULT_SELECTION = frozenset(CODES) - OFF_BY_DEFAULT

__all__ = ["CODES", "DEFAULT_SELECTION", "OFF_BY_DEFAULT", "OPTIONAL", "RULES", "Rule"]
