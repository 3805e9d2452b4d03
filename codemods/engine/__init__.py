"""One file's migration: read the facts, run the rules in order, apply the planned edits."""
