"""What lets most files skip libcst: the gate built from the rules' triggers, and the
statement segmentation of large files. Always checked against the whole-file pass."""
