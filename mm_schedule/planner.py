"""Where ``plan_step`` and ``plan_columns`` were first importable from; they live in ``mm_schedule.plan``."""

from .plan import as_requests, plan_columns, plan_step

__all__ = ["as_requests", "plan_columns", "plan_step"]
