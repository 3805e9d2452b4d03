"""Reading Python source as bytes without parsing it: line ends, where a string literal
ends, and which bytes are comments. Shared by the statement scanner and the
simple-use finder, which both work on raw bytes."""

from __future__ import annotations

import re

# the line breaks Python counts: a lone CR ends a line as well
LINE_END = re.compile(rb"\r\n|\r|\n")

# from just after an opening quote to just after its closing one
STRING_END = {
    b"'''": re.compile(rb"(?:[^\\']|\\.|'(?!''))*'''", re.S),
    b'"""': re.compile(rb'(?:[^\\"]|\\.|"(?!""))*"""', re.S),
    b"'": re.compile(rb"(?:[^\\'\r\n]|\\(?:\r\n|.))*'", re.S),
    b'"': re.compile(rb'(?:[^\\"\r\n]|\\(?:\r\n|.))*"', re.S),
}

_QUOTE_OR_HASH = re.compile(rb"""'''|\"\"\"|'|"|\#""")


def without_comments(text: bytes) -> bytes:
    """``text`` with every comment blanked out; string literals are skipped whole, so a
    ``#`` inside one is no comment. Stops blanking at a string it cannot close."""
    out = bytearray(text)
    pos = 0
    while True:
        match = _QUOTE_OR_HASH.search(text, pos)
        if match is None:
            return bytes(out)
        if match.group() == b"#":
            line_end = LINE_END.search(text, match.start())
            end = line_end.start() if line_end else len(text)
            out[match.start() : end] = b" " * (end - match.start())
            pos = end
        else:
            closing = STRING_END[match.group()].match(text, match.end())
            if closing is None:
                return bytes(out)
            pos = closing.end()
