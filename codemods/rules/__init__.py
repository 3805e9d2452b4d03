"""The rules: plain functions of a ``Migration``, run in the order of ``RULES``.

Each rule is one file that owns its finding codes, its planning function and its
fast-path trigger (``rule.Rule``); adding a rule is adding its file and one line below.
The order matters: attribute and call rewrites reach modules through the imports as the
from-import rule left them, the string rule skips strings a call accounted for, and
pruning needs every rewritten use.
"""

from __future__ import annotations

from ..report import suppression
from ..report.reporter import MOVE_CODES
from . import (
    calls,
    doc_references,
    fork,
    from_imports,
    module_attributes,
    module_slots,
    prune_bindings,
    reexports,
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

# Every finding code, with its short name and meaning (``--json`` reports, docs).
CODES = merge_codes(MOVE_CODES, *(rule.codes for rule in RULES), fork.CODES, reexports.CODES,
                    suppression.CODES)

# Codes that fail --check only when selected (see ``reexports``).
OPTIONAL_CODES = reexports.OPTIONAL_CODES

__all__ = ["CODES", "OPTIONAL_CODES", "RULES", "Rule"]
