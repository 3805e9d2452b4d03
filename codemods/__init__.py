"""Codemod for the SGLang ``mm_utils`` -> ``mm_schedule`` module split (libcst only).

``move_map`` (the data), ``derive`` (builds it), ``transform`` (the one-pass engine and
``MoveImportsCommand`` for libcst's runner), ``cli`` (``mm-schedule-codemod``).
"""
