"""Every file of the package that the docs name exists where they say: a reader who
opens `anyrtd/…` from a doc finds it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"`(anyrtd/[A-Za-z0-9_./-]+)")


def test_every_package_path_the_docs_name_exists() -> None:
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in NAMED.finditer(doc.read_text()):
            path = match.group(1).rstrip(".")
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert missing == []
