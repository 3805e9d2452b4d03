"""Results files that several benchmarks share: each owns one ``## `` section of the file."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, section: str) -> None:
    """Write ``section`` (which starts with its ``## `` heading) into ``path``, in place of
    the section with the same heading if there is one, else at the end; the other
    benchmarks' sections are kept as they are."""
    heading = section.split("\n", 1)[0]
    text = path.read_text() if path.exists() else ""
    if heading in text:
        head, _, rest = text.partition(heading)
        tail = rest[rest.find("\n## ") + 1 :] if "\n## " in rest else ""
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
