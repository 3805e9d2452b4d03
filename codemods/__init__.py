"""Codemod for the SGLang ``mm_utils`` -> ``mm_schedule`` module split (libcst only).

Laid out by role: ``cli`` (``mm-schedule-codemod``), ``pipeline`` (one run over a tree),
``engine`` (one file's migration), ``rules`` (one file per rule, in one ordered table),
``fastpath`` (the gate built from the rules' triggers, large-file segments),
``workspace`` (discovery, configuration, writing, diffs), ``report`` (findings, failures,
exit statuses, reports) and ``movemap`` (the map's data model and ``derive``).
"""
