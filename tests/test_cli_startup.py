"""A client command imports only what it needs: the real `anyrtd` command, with Python's
import-time report on, never loads the database, the migrations, the aiohttp server or the
devserver for `--help` or a read through the control API."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import anyrtd_command

HEAVY = ("sqlalchemy", "alembic", "aiohttp", "anyrtd.devserver", "anyrtd.mirror", "anyrtd.daemon")
"""Top-level names a client command must not import (the mirror and daemon bring the rest)."""


def imported(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `anyrtd ARGS` with `PYTHONPROFILEIMPORTTIME` and return the modules it imported."""
    result = subprocess.run(
        [*anyrtd_command(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PYTHONPROFILEIMPORTTIME": "1",
            "ANYRTD_CONFIG": os.devnull,
            "ANYRTD_LISTEN": f"unix:{tmp / 'nobody.sock'}",
        },
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "anyrtd.cli" in modules, result.stderr[-2000:]
    return result, modules


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("triggers", "--help"),
        ("triggers", "list"),
        ("triggers", "show", "x"),
        ("runs", "list"),
        ("election",),
    ],
)
def test_client_commands_do_not_import_the_daemon_side(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    result, modules = imported(tmp_path, *args)
    assert heavy(modules) == []
    if args[-1] != "--help":
        # It did run: no daemon listens there, and it says so in one line.
        assert result.returncode == 1
        assert "cannot reach the daemon" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("schedule", "preview", "*/15 * * * * *", "-n", "2"),
        ("schedule", "preview", "--every", "30"),
        ("programs", "list"),
        ("triggers", "apply", "--help"),
        ("triggers", "list", "--watch", "--help"),
    ],
)
def test_local_commands_do_not_import_the_daemon_side(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    # These need no daemon: they answer from the schedule module and this device's config.
    result, modules = imported(tmp_path, *args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert heavy(modules) == []


def test_a_preview_does_not_even_import_the_http_client(tmp_path: Path) -> None:
    result, modules = imported(tmp_path, "schedule", "preview", "0 8 * * *")
    assert result.returncode == 0 and "in UTC" in result.stdout
    assert not {m for m in modules if m.split(".")[0] in ("httpx", "asyncio")}


def test_help_does_not_even_import_the_http_client(tmp_path: Path) -> None:
    result, modules = imported(tmp_path, "--help")
    assert result.returncode == 0 and "triggers" in result.stdout
    assert not {m for m in modules if m.split(".")[0] in ("httpx", "asyncio")}


def test_the_daemon_side_is_imported_where_it_is_needed(tmp_path: Path) -> None:
    # The check above would pass if the report were empty: see it name the mirror here.
    result, modules = imported(tmp_path, "db", "current", "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 1
    assert "no mirror at" in result.stderr
    assert "anyrtd.mirror" in modules and "sqlalchemy" in modules


def test_the_cli_modules_import_each_other_without_a_circle() -> None:
    import ast
    import graphlib

    package = Path(__file__).resolve().parent.parent / "anyrtd" / "cli"
    names = {p.stem for p in package.glob("*.py")} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse((package / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "anyrtd.cli":
                # `from anyrtd.cli import format`: a module, never the group itself.
                for alias in node.names:
                    assert alias.name in names, f"{name} imports {alias.name} from anyrtd.cli"
                    edges.add(alias.name)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("anyrtd.cli."):
                edges.add(node.module.split(".")[2])  # type: ignore[union-attr]
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises on a cycle
    assert set(order) == names
