"""Flags, `ANYRTD_*` variables and the config file go through one check: through the real
`anyrtd` command, a bad value is one line naming the value and the fix, exit status 2, and
nothing is opened (no state directory, no devserver, no control API)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import anyrtd_command


def run(tmp: Path, *args: str, config: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    conf = tmp / "anyrtd.toml"
    conf.write_text(config)
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANYRTD_")}
    return subprocess.run(
        [*anyrtd_command(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "ANYRTD_CONFIG": str(conf), "ANYRTD_STATE_DIR": str(tmp / "state"), **env},
    )


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    for word in words:
        assert word in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("flag", "value", "variable", "key", "words"),
    [
        ("--tick", "0", "ANYRTD_TICK", "tick_s", ("'0'", "greater than 0", "such as 5")),
        ("--tick", "-2", "ANYRTD_TICK", "tick_s", ("'-2'", "greater than 0", "--tick")),
        ("--election-poll", "-1", None, "election_poll_s", ("'-1'", "greater than 0", "10")),
        ("--election-poll", "soon", None, "election_poll_s", ("'soon'", "number of seconds")),
        (
            "--server",
            "http://127.0.0.1:99999",
            "ANYRTD_SERVER",
            "server",
            ("'http://127.0.0.1:99999'", "out of range", "http://127.0.0.1:7001"),
        ),
        ("--server", "http://[::1", "ANYRTD_SERVER", "server", ("'http://[::1'", "IPv6")),
        ("--server", "127.0.0.1:7001", "ANYRTD_SERVER", "server", ("'127.0.0.1:7001'", "http://")),
        (
            "--listen",
            "http://127.0.0.1:7010",
            "ANYRTD_LISTEN",
            "listen",
            ("'http://127.0.0.1:7010'", "without a scheme", "127.0.0.1:7010"),
        ),
    ],
)
def test_serve_refuses_a_bad_value_the_same_from_flag_variable_and_file(
    tmp_path: Path,
    flag: str,
    value: str,
    variable: str | None,
    key: str,
    words: tuple[str, ...],
) -> None:
    from_flag = refused(run(tmp_path, "serve", flag, value), *words)
    if variable is not None:
        assert refused(run(tmp_path, "serve", **{variable: value})) == from_flag
    assert refused(run(tmp_path, "serve", config=f'{key} = "{value}"\n')) == from_flag
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("triggers", "list"),
        ("triggers", "show", "x"),
        ("triggers", "create", "--id", "x", "--every", "60", "--program", "a:b@v1"),
        ("runs", "list"),
        ("devices", "list"),
        ("election",),
        ("doctor",),
    ],
)
@pytest.mark.parametrize(
    "server", ["http://127.0.0.1:99999", "http://[::1", "127.0.0.1:7001", "localhost:7001"]
)
def test_client_commands_refuse_a_malformed_server_without_a_traceback(
    tmp_path: Path, args: tuple[str, ...], server: str
) -> None:
    refused(run(tmp_path, *args, "--server", server), repr(server), "--server, ANYRTD_SERVER")


def test_the_shared_options_work_before_the_command_too(tmp_path: Path) -> None:
    refused(run(tmp_path, "--server", "127.0.0.1:7001", "triggers", "list"), "'127.0.0.1:7001'")
    # The command's own value wins over the group's.
    result = run(tmp_path, "--server", "127.0.0.1:1", "triggers", "list", "--server", "http://[::1")
    refused(result, "'http://[::1'")


def test_client_commands_refuse_a_listen_address_with_a_scheme(tmp_path: Path) -> None:
    line = refused(run(tmp_path, "triggers", "list", "--listen", "http://127.0.0.1:7010"))
    assert line == refused(run(tmp_path, "runs", "list", ANYRTD_LISTEN="http://127.0.0.1:7010"))


def test_dev_refuses_bad_values_before_starting_anything(tmp_path: Path) -> None:
    state = tmp_path / "dev-state"
    refused(run(tmp_path, "dev", "--state-dir", str(state), "--tick", "0"), "'0'", "--tick")
    refused(
        run(tmp_path, "dev", "--state-dir", str(state), "--listen", "http://127.0.0.1:0"),
        "without a scheme",
    )
    assert not state.exists()


def test_a_good_value_still_passes(tmp_path: Path) -> None:
    result = run(tmp_path, "db", "current", "--server", "http://[::1]:7001/")
    # No mirror yet: exit 1 with its own message, not a refused setting.
    assert result.returncode == 1
    assert "no mirror at" in result.stderr


def test_a_setting_written_below_a_program_table_is_refused_naming_the_trap(
    tmp_path: Path,
) -> None:
    # TOML puts `missed_grace_s` into the program's table: refused, not silently dropped.
    config = '[programs."mine@v1"]\nargv = ["/bin/true"]\nmissed_grace_s = 90\n'
    line = refused(
        run(tmp_path, "serve", config=config),
        "config table programs.\"mine@v1\": unknown key 'missed_grace_s'",
        "known keys: argv, cwd, env",
        "top-level setting",
        "move it above the first table",
    )
    assert "[table] header" in line
    refused(
        run(tmp_path, "serve", config='[programs."mine@v1"]\nargv = ["/bin/true"]\nargs = []\n'),
        "unknown key 'args'; known keys: argv, cwd, env",
    )
    assert not (tmp_path / "state").exists()
