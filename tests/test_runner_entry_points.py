"""Programs from installed packages: the `anyrtd.programs` entry-point group, found for real."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import run_of

from anyrtd.client import ServerClient
from anyrtd.clock import SystemClock
from anyrtd.config import CommandProgram
from anyrtd.rows import RunRow
from anyrtd.runner import Runner


@pytest.fixture
async def client() -> AsyncIterator[ServerClient]:
    c = ServerClient("http://127.0.0.1:9")  # nothing listens there: no program reaches it
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Install a package with programs the way pip does: a module and its dist-info on sys.path."""
    module = f"anyrtd_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            IMPORTS = []
            IMPORTS.append(1)
            VALUE = 42

            async def main(args, ctx):
                ctx.log.info("plugin ran for %s", ctx.run_id)
                return {"title": "hello " + args["who"]}
            """
        )
    )
    dist = tmp_path / "anyrtd_test_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: anyrtd-test-plugin\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            f"""
            [anyrtd.programs]
            plugin:hello@v1 = {module}:main
            plugin:broken@v1 = {module}_missing:main
            plugin:value@v1 = {module}:VALUE
            mine:backup@v1 = {module}:main

            [console_scripts]
            not-a-program = {module}:main
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield module
    finally:
        sys.modules.pop(module, None)


def make_runner(client: ServerClient, **commands: CommandProgram) -> Runner:
    return Runner(
        client=client, clock=SystemClock(), agent_name="bao", space="s", commands=commands
    )


def request(program: str) -> tuple[RunRow, dict[str, Any]]:
    return run_of(program, {"who": "world"}, run_id="run-ep", trigger_id=None, device="dev")


async def test_an_entry_point_program_is_loaded_lazily_and_runs(
    client: ServerClient, plugin: str
) -> None:
    runner = make_runner(client)
    assert plugin not in sys.modules

    out = await runner.run(*request("plugin:hello@v1"))

    assert out.status == "ok", out.error
    assert out.result == {"title": "hello world"}
    assert "INFO plugin ran for run-ep" in out.output
    program = runner.resolve("plugin:hello@v1")
    assert program is not None and program.source == "entry_point"
    assert program.origin == f"{plugin}:main"
    await runner.run(*request("plugin:hello@v1"))
    assert sys.modules[plugin].IMPORTS == [1], "the module was loaded more than once"


async def test_an_entry_point_wins_over_a_config_command(client: ServerClient, plugin: str) -> None:
    runner = make_runner(client, **{"mine:backup@v1": CommandProgram(argv=("/bin/false",))})
    program = runner.resolve("mine:backup@v1")

    assert program is not None and program.source == "entry_point"


async def test_an_entry_point_that_fails_to_load_is_program_not_found(
    client: ServerClient, plugin: str
) -> None:
    runner = make_runner(client)
    out = await runner.run(*request("plugin:broken@v1"))

    assert (out.status, out.error_type) == ("FAILED", "ProgramNotFound")
    assert out.error is not None
    assert f"{plugin}_missing:main" in out.error and "ModuleNotFoundError" in out.error
    assert not runner.is_installed("plugin:broken@v1")


async def test_an_entry_point_that_is_not_callable_is_program_not_found(
    client: ServerClient, plugin: str
) -> None:
    out = await make_runner(client).run(*request("plugin:value@v1"))

    assert (out.status, out.error_type) == ("FAILED", "ProgramNotFound")
    assert out.error is not None and "is a int, not an async function" in out.error


async def test_entry_points_of_other_groups_are_not_programs(
    client: ServerClient, plugin: str
) -> None:
    assert not make_runner(client).is_installed("not-a-program")


async def test_a_package_installed_later_is_seen_after_a_rescan(
    client: ServerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = make_runner(client)
    assert not runner.is_installed("late:prog@v1")

    module = f"anyrtd_late_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text("async def main(args, ctx):\n    return None\n")
    dist = tmp_path / "anyrtd_late-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: anyrtd-late\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[anyrtd.programs]\nlate:prog@v1 = {module}:main\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert not runner.is_installed("late:prog@v1"), "the index is cached"
        runner.rescan_entry_points()
        assert runner.is_installed("late:prog@v1")
        assert (await runner.run(*request("late:prog@v1"))).status == "ok"
    finally:
        sys.modules.pop(module, None)


async def test_a_broken_entry_point_does_not_hide_a_declared_command(
    client: ServerClient, plugin: str
) -> None:
    runner = make_runner(client, **{"plugin:broken@v1": CommandProgram(argv=("/bin/true",))})
    program = runner.resolve("plugin:broken@v1")

    assert program is not None and program.source == "command"
    assert (await runner.run(*request("plugin:broken@v1"))).status == "ok"
