"""Each stage of the daemon logs under its own module's name, so a line says which stage
wrote it (`anyrtd.firing: firing …`) and `--log-level` style filters can pick one."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import pytest

import anyrtd
from anyrtd import apply, firing, history, role, sync, timer

PACKAGE = Path(anyrtd.__file__).parent
ROOT = Path(__file__).resolve().parent.parent
"""The checkout: the docs are not installed with the package."""


@pytest.mark.parametrize("module", [apply, sync, firing, timer, history, role])
def test_a_stage_logs_under_its_own_name(module: ModuleType) -> None:
    assert module.log.name == module.__name__


def test_only_the_wiring_logs_as_the_daemon() -> None:
    named = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "anyrtd.daemon"
            ):
                named.append(path.relative_to(PACKAGE).as_posix())
    assert named == ["daemon.py"]


def test_the_log_line_in_the_service_docs_names_a_logger_that_writes_it() -> None:
    docs = (ROOT / "docs" / "service.md").read_text()
    line = next(ln for ln in docs.splitlines() if " INFO anyrtd." in ln and "firing " in ln)
    logger = line.split(" INFO ", 1)[1].split(":", 1)[0]
    assert logger == firing.log.name
    source = Path(firing.__file__).read_text()
    assert '"firing %s (%s)%s"' in source
