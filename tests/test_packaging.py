"""The packaged service files: systemd units, the example config and the launchd plists."""

from __future__ import annotations

import os
import plistlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from anyrtd.config import Config, load_config

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_UNIT = ROOT / "packaging" / "systemd" / "anyrtd.service"
USER_UNIT = ROOT / "packaging" / "systemd" / "user" / "anyrtd.service"
EXAMPLE_CONFIG = ROOT / "packaging" / "systemd" / "anyrtd.toml.example"
LAUNCH_AGENT = ROOT / "packaging" / "launchd" / "LaunchAgents" / "org.anyrtd.anyrtd.plist"
LAUNCH_DAEMON = ROOT / "packaging" / "launchd" / "LaunchDaemons" / "org.anyrtd.anyrtd.plist"
CHECKS = ROOT / ".ci" / "systemd-checks"

MAX_EXPOSURE = 2.5
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed here (.ci/systemd-checks installs it in CI)",
)


def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Return each section's (key, value) pairs in order; a key may repeat, as systemd allows."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path}: {line!r} before any section"
        assert not line.endswith("\\"), f"{path}: keep {line!r} on one line"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: {line!r} is not key=value"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def one(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key}= appears {len(found)} times, expected once"
    return found[0]


def seconds(timespan: str) -> float:
    """Return a systemd time span like `30s`, `1min 30s` or `90` in seconds."""
    units = {"": 1.0, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", timespan):
        total += float(number) * units[unit]
    return total


def test_system_unit_is_a_notify_service_with_watchdog_restart_and_directories() -> None:
    unit = parse_unit(SYSTEM_UNIT)
    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "NotifyAccess") == "main"
    assert 0 < seconds(one(unit, "Service", "WatchdogSec")) <= 120
    assert one(unit, "Service", "Restart") == "on-failure"
    assert one(unit, "Service", "StateDirectory") == "anyrtd"
    assert one(unit, "Service", "RuntimeDirectory") == "anyrtd"
    assert one(unit, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one(unit, "Service", "KillMode") == "mixed"
    assert one(unit, "Install", "WantedBy") == "multi-user.target"
    argv = one(unit, "Service", "ExecStart").split()
    assert argv[:2] == ["/usr/local/bin/anyrtd", "serve"]
    assert argv[argv.index("--listen") + 1] == "unix:/run/anyrtd/control.sock"


def test_system_unit_stop_timeout_outlasts_the_grace_period() -> None:
    unit = parse_unit(SYSTEM_UNIT)
    stop = seconds(one(unit, "Service", "TimeoutStopSec"))
    grace = load_config(str(EXAMPLE_CONFIG), env={}).grace_s
    assert grace == Config().grace_s
    assert stop >= grace + 10, f"TimeoutStopSec={stop}s leaves too little past grace_s={grace}s"


def test_system_unit_is_hardened_but_may_network_and_spawn_process_groups() -> None:
    unit = parse_unit(SYSTEM_UNIT)
    expected = {
        "DynamicUser": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "MemoryDenyWriteExecute": "yes",
    }
    for key, value in expected.items():
        assert one(unit, "Service", key) == value, key
    assert values(unit, "Service", "PrivateNetwork") in ([], ["no"])
    filters = values(unit, "Service", "SystemCallFilter")
    assert "@system-service" in filters
    # setsid and setpgid live in @process, which command programs' own process groups need.
    denied = " ".join(f[1:] for f in filters if f.startswith("~")).split()
    assert "@process" not in denied
    assert not {"setsid", "setpgid"} & set(denied)


def test_user_unit_keeps_to_options_a_user_manager_can_apply() -> None:
    unit = parse_unit(USER_UNIT)
    assert one(unit, "Service", "Type") == "notify"
    assert seconds(one(unit, "Service", "WatchdogSec")) > 0
    assert one(unit, "Service", "Restart") == "on-failure"
    assert one(unit, "Service", "ExecStart").split()[1] == "serve"
    assert seconds(one(unit, "Service", "TimeoutStopSec")) >= Config().grace_s + 10
    assert one(unit, "Install", "WantedBy") == "default.target"
    assert one(unit, "Service", "NoNewPrivileges") == "yes"
    needs_root = {
        "User",
        "DynamicUser",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "CapabilityBoundingSet",
        "StateDirectory",
    }
    present = {k for pairs in unit.values() for k, _ in pairs}
    assert not needs_root & present
    # network-online.target exists only in the system manager.
    assert not [v for pairs in unit.values() for _, v in pairs if "network-online" in v]


def test_example_config_loads_and_names_the_units_control_socket() -> None:
    config = load_config(str(EXAMPLE_CONFIG), env={})
    argv = one(parse_unit(SYSTEM_UNIT), "Service", "ExecStart").split()
    assert config.listen == argv[argv.index("--listen") + 1]
    assert config.server == Config().server
    assert config.space == "bao"


def load_plist(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        data = plistlib.load(fh)
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("path", [LAUNCH_AGENT, LAUNCH_DAEMON], ids=["agent", "daemon"])
def test_launchd_plists_parse_and_keep_anyrtd_alive(path: Path) -> None:
    plist = load_plist(path)
    assert plist["Label"] == path.stem
    assert plist["ProgramArguments"][1] == "serve"
    assert plist["ProgramArguments"][0].startswith("/")
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ProcessType"] == "Standard"
    assert plist["ExitTimeOut"] >= Config().grace_s + 10
    for key in ("StandardOutPath", "StandardErrorPath"):
        assert plist[key].startswith("/") and plist[key].endswith(".log")


def test_launch_daemon_runs_as_a_role_account_with_its_own_state() -> None:
    plist = load_plist(LAUNCH_DAEMON)
    assert plist["UserName"] == "_anyrtd"
    argv = plist["ProgramArguments"]
    assert argv[argv.index("--state-dir") + 1] == plist["WorkingDirectory"]
    assert "--config" in argv


def test_launch_agent_log_path_is_the_one_the_readme_substitutes() -> None:
    plist = load_plist(LAUNCH_AGENT)
    readme = (ROOT / "packaging" / "launchd" / "README.md").read_text()
    assert plist["StandardErrorPath"].startswith("/Users/YOU/")
    assert "s|/Users/YOU|$HOME|g" in readme


def copy_with_stand_in(src: Path, dest_dir: Path, program: str) -> Path:
    """Copy a unit with its ExecStart= program replaced by an executable that exists."""
    stand_in = dest_dir / "bin" / "anyrtd"
    stand_in.parent.mkdir(parents=True, exist_ok=True)
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    text = src.read_text()
    assert f"\nExecStart={program} " in text
    dest = dest_dir / src.name
    dest.write_text(text.replace(f"\nExecStart={program} ", f"\nExecStart={stand_in} "))
    return dest


def run_analyze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@needs_analyze
def test_systemd_analyze_verify_reports_nothing_for_the_system_unit(tmp_path: Path) -> None:
    unit = copy_with_stand_in(SYSTEM_UNIT, tmp_path, "/usr/local/bin/anyrtd")
    done = run_analyze("verify", str(unit))
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@needs_analyze
def test_systemd_analyze_verify_reports_nothing_for_the_user_unit(tmp_path: Path) -> None:
    unit = copy_with_stand_in(USER_UNIT, tmp_path, "%h/.local/bin/anyrtd")
    # Short, as a real one is: the user's other sockets under it must fit a socket path
    # (108 bytes), which a pytest-xdist worker's tmp_path may not leave room for.
    with tempfile.TemporaryDirectory(prefix="xdg-") as runtime:
        env = {"XDG_RUNTIME_DIR": runtime}
        done = run_analyze("--user", "verify", str(unit), env=env)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@needs_analyze
def test_system_unit_exposure_level_is_at_most_2_5(tmp_path: Path) -> None:
    unit = copy_with_stand_in(SYSTEM_UNIT, tmp_path, "/usr/local/bin/anyrtd")
    done = run_analyze("security", "--offline=yes", str(unit))
    assert done.returncode == 0, done.stderr
    found = re.search(r"Overall exposure level for anyrtd\.service: ([0-9.]+)", done.stdout)
    assert found, done.stdout
    assert float(found.group(1)) <= MAX_EXPOSURE, done.stdout


@needs_analyze
def test_the_units_comment_gives_the_exposure_systemd_analyze_reports(tmp_path: Path) -> None:
    unit = copy_with_stand_in(SYSTEM_UNIT, tmp_path, "/usr/local/bin/anyrtd")
    done = run_analyze("security", "--offline=yes", str(unit))
    found = re.search(r"Overall exposure level for anyrtd\.service: ([0-9.]+)", done.stdout)
    assert found, done.stdout
    said = re.search(r"scores this unit about ([0-9.]+)", SYSTEM_UNIT.read_text())
    assert said, "the unit's hardening comment gives no exposure figure"
    assert float(said.group(1)) == round(float(found.group(1)), 1), done.stdout


@needs_analyze
def test_ci_unit_checks_pass_and_fail_past_the_limit() -> None:
    ok = subprocess.run([str(CHECKS)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count("reports nothing") == 2
    strict = subprocess.run(
        [str(CHECKS)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ANYRTD_MAX_EXPOSURE": "0.1"},
    )
    assert strict.returncode == 1
    assert "above 0.1" in strict.stderr


def test_every_package_ships_and_the_command_is_the_cli_group() -> None:
    import tomllib

    import click

    from anyrtd.cli import main

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "anyrtd").rglob("__init__.py")
    }
    # A package left out of the list is missing from `pip install .` (not from -e).
    assert found <= listed, sorted(found - listed)
    assert project["project"]["scripts"] == {"anyrtd": "anyrtd.cli:main"}
    assert isinstance(main, click.Group)
    assert {"serve", "dev", "devserver", "db", "triggers", "runs", "doctor"} <= set(main.commands)
