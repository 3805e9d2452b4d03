"""Codemod for the SGLang ``mm_utils`` -> ``mm_schedule`` module split (libcst only)."""
