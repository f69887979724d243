"""`anyrtd.escape`: the one function that makes synced text safe for a terminal and a log
line, and the two places that use it (the log's formatters and the command line's echo)."""

from __future__ import annotations

import ast
import json
import logging
import sys
from pathlib import Path

import pytest

import anyrtd
from anyrtd.cli.format import compact, table
from anyrtd.escape import printable, printable_json
from anyrtd.logs import JournalFormatter, PlainFormatter


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1b[2Jb", "a\\x1b[2Jb"),
        ("\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"),
        ("nul\x00del\x7f", "nul\\x00del\\x7f"),
        ("c1\x9b31m\x85", "c1\\x9b31m\\x85"),
        ("rtl\u202eltr\u2066\u200b\ufeff", "rtl\\u202eltr\\u2066\\u200b\\ufeff"),
        ("line\nsep\u2028para\u2029", "line\\nsep\\u2028para\\u2029"),
        ("tab\tcr\r", "tab\\tcr\\r"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("lone\ud800", "lone\\ud800"),
    ],
)
def test_control_format_and_separator_characters_are_escaped(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_text_of_every_script_and_a_backslash_pass_as_they_are() -> None:
    text = 'naïve Ünïcödé 漢字 русский עברית 🙂 C:\\path a=b "q" ~'
    assert printable(text) == text
    assert printable(text, lines=True) == text


def test_many_lines_keep_their_newlines_and_tabs_only() -> None:
    assert printable("a\n\tb\r\n\x1b[0m", lines=True) == "a\n\tb\\r\n\\x1b[0m"


def test_json_keeps_its_document_and_escapes_what_json_leaves_raw() -> None:
    value = {"id": "x\x7f\x9b\u202e\U000e0041\x1b", "n": [1, "é"]}
    encoded = printable_json(json.dumps(value, ensure_ascii=False, indent=2))
    assert json.loads(encoded) == value
    assert encoded.isascii() is False  # é stays é
    assert all(c not in encoded for c in "\x7f\x9b\u202e\U000e0041\x1b")
    assert "\\u007f\\u009b\\u202e\\udb40\\udc41\\u001b" in encoded


def test_a_table_cell_and_a_compact_value_are_one_escaped_line() -> None:
    shown = table(["ID", "NAME"], [["a\nb", "\x1b[2Jx"], ["c", "d"]])
    assert shown.splitlines() == ["ID    NAME", "a\\nb  \\x1b[2Jx", "c     d"]
    assert compact({"text": "\u202e\x9b"}) == '{"text": "\\u202e\\u009b"}'


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("anyrtd.test", logging.INFO, __file__, 1, msg, args, None)
    rec.__dict__.update(extra)
    return rec


@pytest.mark.parametrize("formatter", [PlainFormatter(), JournalFormatter()])
def test_a_log_line_is_one_line_with_no_control_character(formatter: logging.Formatter) -> None:
    hostile = "evil\x1b[2J\u202e\x00\n2026-12-02T00:00:00.000+00:00 INFO anyrtd.daemon: forged"
    line = formatter.format(record("firing %s", hostile, trigger="t\x1b1", run=hostile))
    assert "\n" not in line
    assert not any(c in line for c in "\x1b\u202e\x00")
    assert "firing evil\\x1b[2J\\u202e\\x00\\n2026-12-02" in line
    assert "trigger=t\\x1b1" in line


def test_a_traceback_keeps_its_lines_and_escapes_the_rest() -> None:
    try:
        raise ValueError("bad\x1b]52;c;aGk=\x07 id")
    except ValueError:
        rec = record("failed")
        rec.exc_info = sys.exc_info()
    text = JournalFormatter().format(rec)
    assert "\x1b" not in text and "\x07" not in text
    assert "ValueError: bad\\x1b]52;c;aGk=\\x07 id" in text
    assert all(line.startswith("<6>") for line in text.split("\n"))


def test_the_command_line_prints_only_through_its_escaping_echo() -> None:
    # `anyrtd/cli/shared.py` holds `echo` and `emit_json`; every other module calls them.
    cli = Path(anyrtd.__file__).parent / "cli"
    calls = []
    for path in sorted(cli.glob("*.py")):
        if path.name == "shared.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "click"
                and node.attr in ("echo", "secho")
            ) or (isinstance(node, ast.Name) and node.id == "print"):
                calls.append(f"{path.name}:{node.lineno}")
    assert calls == []
