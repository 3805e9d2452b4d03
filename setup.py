"""The optional C helpers of the host path; everything else is in pyproject.toml.

They are declared here because setuptools still calls pyproject.toml's ``ext-modules``
table experimental and warns about it on every install.
"""

from setuptools import Extension, setup

# Optional: without a C compiler the install still succeeds and torch code does their work.
EXTENSIONS = [
    # placeholder-token membership for the SGLang-compatible mask, in one pass
    Extension("mm_schedule._placeholder_set", ["mm_schedule/_placeholder_set.c"], optional=True),
    # the embedding cache's lookup of a step whose every key is cached
    Extension("mm_schedule._cache_hits", ["mm_schedule/_cache_hits.c"], optional=True),
    # the check of an encoder's list of outputs that can be cached as they are
    Extension("mm_schedule._output_checks", ["mm_schedule/_output_checks.c"], optional=True),
    # the flat planner's pass over a step's items
    Extension("mm_schedule.plan._flat_columns", ["mm_schedule/plan/_flat_columns.c"], optional=True),
    # a step's row copies in one call (streaming stores for large destinations)
    Extension("mm_schedule.kernels.segment_copy._stream_copy", ["kernels/segment_copy/_stream_copy.c"], optional=True),
]

if __name__ == "__main__":
    setup(ext_modules=EXTENSIONS)
