"""Escaping of untrusted text before it reaches a terminal or a log line.

Trigger ids, names and run output are synced data: whoever can write the space controls
them. A control character in them could move the cursor, clear the screen, set the
clipboard (OSC 52), reverse the text that follows (U+202E), or start a line of its own in
the journal. `printable` writes every such character as a visible escape, the way
`systemctl` and `journalctl` do: `\\x1b`, `\\x00`, `\\x7f`, `\\x9b`, `\\u202e`, and `\\n`,
`\\r`, `\\t`. The command line and the log (`anyrtd/logs.py`) both use it.

What is escaped: the control characters (C0, DEL, C1), the format characters (bidi
overrides and isolates, zero-width characters, the byte order mark...), the line and
paragraph separators and lone surrogates. Letters of every script, symbols, emoji and
plain spaces pass as they are; so does the backslash, so a path reads as written.
"""

from __future__ import annotations

import re
import unicodedata

_SUSPECT = re.compile(r"[^\x20-\x7e]")
"""What is not printable ASCII: only these characters need a look."""

_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""The Unicode categories written as escapes: control, format, surrogate, line and
paragraph separators."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

_KEPT_LINES = frozenset("\n\t")
"""What text of many lines (a run's output) keeps as it is."""


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _one_line(match: re.Match[str]) -> str:
    char = match.group()
    return _escape(char) if unicodedata.category(char) in _ESCAPED else char


def _many_lines(match: re.Match[str]) -> str:
    char = match.group()
    if char in _KEPT_LINES or unicodedata.category(char) not in _ESCAPED:
        return char
    return _escape(char)


def printable(text: str, *, lines: bool = False) -> str:
    """Return `text` with every control, format or separator character escaped: on one
    line, or with `lines`, keeping its newlines and tabs (a run's output, a traceback)."""
    if text.isascii() and text.isprintable():
        return text
    return _SUSPECT.sub(_many_lines if lines else _one_line, text)


def printable_json(encoded: str) -> str:
    """Return JSON text (`json.dumps(..., ensure_ascii=False)`, whose C0 controls are
    escaped already) with every other character `printable` escapes as a JSON escape: the
    same document, safe on a terminal."""
    if encoded.isascii() and "\x7f" not in encoded:
        return encoded
    return _SUSPECT.sub(_json_escape, encoded)


def _json_escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    # Below 0x20 only the document's own newlines: JSON escaped those inside strings.
    if code < 0x20 or unicodedata.category(char) not in _ESCAPED:
        return char
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON spells a character beyond the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
