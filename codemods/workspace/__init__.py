"""The user's files: which ones a run looks at, their configuration, writing them, diffs."""
