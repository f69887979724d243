"""Shell completion: the scripts in contrib/ are what click generates, and ids complete."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import click
import pytest
from conftest import anyrtd_command

from anyrtd.cli import main

COMPLETION = Path(__file__).resolve().parent.parent / "contrib" / "completion"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_shipped_script_is_the_generated_one(shell: str) -> None:
    generated = subprocess.run(
        anyrtd_command(),
        env={**os.environ, "_ANYRTD_COMPLETE": f"{shell}_source"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    shipped = (COMPLETION / f"anyrtd.{shell}").read_text()
    assert shipped == generated, f"regenerate contrib/completion/anyrtd.{shell} (docs/cli.md)"


def _complete(words: str, cword: int, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run(
        anyrtd_command(),
        env={
            **os.environ,
            **(env or {}),
            "_ANYRTD_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(cword),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [line.split(",", 1)[1] for line in out.splitlines() if line.startswith("plain,")]


def test_commands_and_subcommands_complete() -> None:
    assert "triggers" in _complete("anyrtd tri", 1)
    assert set(_complete("anyrtd triggers ", 2)) >= {"list", "show", "create", "run", "delete"}


def test_trigger_ids_complete_to_nothing_when_no_daemon_answers(tmp_path: Path) -> None:
    env = {"ANYRTD_LISTEN": f"unix:{tmp_path / 'none.sock'}", "ANYRTD_CONFIG": "/dev/null"}
    assert _complete("anyrtd triggers show ", 3, env) == []


def test_every_id_argument_completes() -> None:
    triggers = main.commands["triggers"]
    assert isinstance(triggers, click.Group)
    for name in ("show", "edit", "enable", "disable", "pin", "unpin", "run", "delete"):
        command = triggers.commands[name]
        argument = next(p for p in command.params if p.name == "trigger_id")
        assert argument._custom_shell_complete is not None, name
