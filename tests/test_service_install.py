"""`anyrtd service install` and `uninstall`: the rendered files, the refusals, and the whole
round trip under the real systemd of tests/systemd_sandbox.py.

The round trip runs the installed command itself inside the sandbox's namespaces (as a user
would run `sudo anyrtd service install` on a machine with systemd), from a virtual environment
under /opt built from this checkout, so its `systemctl` talks to the sandbox's systemd; the
`--user` round trip talks to root's user manager there, over a /root private to the sandbox.
The launchd plists cannot be loaded here: they are rendered and checked with `plistlib`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import httpx
import pytest
from systemd_machine import (
    CONFIG_DIR,
    REPO,
    STATE_PRIVATE,
    UNIT,
    WANTS_LINK,
    Systemd,
    foreign_units,
    remove_installed,
)
from test_packaging import one, parse_unit

from anyrtd.config import DEFAULT_LISTEN, load_config
from anyrtd.service_files import (
    COMMAND_LINK,
    EXAMPLE_CONFIG,
    LABEL,
    PACKAGED,
    SYSTEM_UNIT,
    UNIT_HEADER,
    Installation,
    ServiceFileError,
    exec_start,
    exec_word,
    hidden_place,
    launchd_target,
    packaged,
    plist_values,
    render_unit,
    systemd_target,
    user_config,
)

pytest_plugins = ("systemd_fixtures",)

CONFIG = CONFIG_DIR / "anyrtd.toml"
MIRROR = STATE_PRIVATE / "anyrtd" / "anyrtd.sqlite3"
SOCKET_ARGS = "serve --listen unix:/run/anyrtd/control.sock"
OPT = Installation(("/opt/anyrtd/bin/anyrtd",), (Path("/opt/anyrtd/bin/anyrtd"),))


# --- the files, rendered ---------------------------------------------------------------------


def test_every_packaged_file_ships_in_the_wheel() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    for name in PACKAGED:
        assert (resources.files("anyrtd") / "packaging" / name).is_file(), name
        folder, _, base = f"anyrtd/packaging/{name}".rpartition("/")
        package = folder.replace("/", ".")
        assert package in setuptools["packages"], name
        assert any(fnmatch.fnmatch(base, p) for p in setuptools["package-data"][package]), name
        assert packaged(name) == (REPO / "packaging" / name).read_text()


def test_the_system_unit_runs_this_installation_and_is_otherwise_the_packaged_one() -> None:
    target = systemd_target(OPT, user=False, env={}, home=Path("/root"))
    assert target.unit_path == Path("/etc/systemd/system/anyrtd.service")
    assert exec_start(target.unit_text) == f"/opt/anyrtd/bin/anyrtd {SOCKET_ARGS}"
    assert target.unit_text.startswith(UNIT_HEADER)
    original = packaged(SYSTEM_UNIT).splitlines()
    rendered = target.unit_text.removeprefix(UNIT_HEADER).splitlines()
    assert [a for a, b in zip(original, rendered, strict=True) if a != b] == [
        f"ExecStart=/usr/local/bin/anyrtd {SOCKET_ARGS}"
    ]
    assert target.config_path == CONFIG and target.config_text == packaged(EXAMPLE_CONFIG)


def test_python_m_anyrtd_is_run_the_same_way_and_odd_paths_are_quoted() -> None:
    program = ("/srv/any rtd/bin/python3", "-P", "-m", "anyrtd")
    unit = render_unit(packaged(SYSTEM_UNIT), program)
    assert exec_start(unit) == f'"/srv/any rtd/bin/python3" -P -m anyrtd {SOCKET_ARGS}'
    assert exec_word("/opt/100%/$HOME") == '"/opt/100%%/$$HOME"'
    assert exec_word('/opt/a"b\\c') == '"/opt/a\\"b\\\\c"'
    with pytest.raises(ServiceFileError, match="control character"):
        exec_word("/opt/a\nb")


def test_this_process_is_installed_as_python_m_anyrtd() -> None:
    # Under pytest, argv[0] is not an `anyrtd` script: the unit runs this interpreter.
    found = Installation.running()
    assert found.program == (os.path.abspath(sys.executable), "-P", "-m", "anyrtd")
    assert Path(os.path.realpath(sys.executable)) in found.places
    import anyrtd

    assert Path(os.path.realpath(anyrtd.__file__)) in found.places


def test_the_user_unit_and_config_go_under_the_xdg_config_home(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path / "st")}
    target = systemd_target(OPT, user=True, env=env, home=Path("/home/me"))
    assert target.unit_path == tmp_path / "cfg/systemd/user/anyrtd.service"
    assert target.config_path == tmp_path / "cfg/anyrtd/anyrtd.toml"
    assert target.state_dir == tmp_path / "st/anyrtd"
    assert target.systemctl == ("systemctl", "--user")
    assert exec_start(target.unit_text) == "/opt/anyrtd/bin/anyrtd serve"
    assert one(parse_unit_text(target.unit_text, tmp_path), "Install", "WantedBy") == (
        "default.target"
    )
    default = systemd_target(OPT, user=True, env={}, home=Path("/home/me"))
    assert default.unit_path == Path("/home/me/.config/systemd/user/anyrtd.service")


def parse_unit_text(text: str, where: Path) -> dict[str, list[tuple[str, str]]]:
    path = where / "rendered.service"
    path.write_text(text)
    return parse_unit(path)


def test_the_user_config_keeps_the_default_listen_address(tmp_path: Path) -> None:
    system = tmp_path / "system.toml"
    system.write_text(packaged(EXAMPLE_CONFIG))
    user = tmp_path / "user.toml"
    user.write_text(user_config(packaged(EXAMPLE_CONFIG)))
    assert load_config(str(system), env={}).listen == "unix:/run/anyrtd/control.sock"
    assert load_config(str(user), env={}).listen == DEFAULT_LISTEN


def test_the_launch_agent_runs_this_installation_as_you(tmp_path: Path) -> None:
    program = ("/Users/me/.local/pipx/venvs/anyrtd & co/bin/python", "-P", "-m", "anyrtd")
    installation = Installation(program, ())
    target = launchd_target(installation, user=True, env={}, home=Path("/Users/me"), uid=501)
    plist = plist_values(target.plist_text)
    assert plist["Label"] == LABEL
    assert plist["ProgramArguments"] == [*program, "serve"]
    assert plist["StandardErrorPath"] == "/Users/me/Library/Logs/anyrtd/anyrtd.log"
    assert plist["StandardOutPath"] == plist["StandardErrorPath"]
    assert plist["KeepAlive"] == {"SuccessfulExit": False} and plist["RunAtLoad"] is True
    assert "<string>/Users/YOU/" not in target.plist_text
    assert target.plist_path == Path("/Users/me/Library/LaunchAgents/org.anyrtd.anyrtd.plist")
    assert target.domain == "gui/501" and target.service == f"gui/501/{LABEL}"
    assert target.config_path == Path("/Users/me/.config/anyrtd/anyrtd.toml")
    assert target.config_text == user_config(packaged(EXAMPLE_CONFIG))
    assert target.dirs == ((Path("/Users/me/Library/Logs/anyrtd"), 0o755, None),)


def test_the_launch_daemon_runs_this_installation_as_its_role_account() -> None:
    target = launchd_target(OPT, user=False, env={}, home=Path("/var/root"), uid=0)
    plist = plist_values(target.plist_text)
    assert plist["ProgramArguments"] == [
        "/opt/anyrtd/bin/anyrtd",
        "serve",
        "--config",
        "/usr/local/etc/anyrtd/anyrtd.toml",
        "--state-dir",
        "/usr/local/var/anyrtd",
    ]
    assert plist["UserName"] == target.account == "_anyrtd"
    assert target.plist_path == Path("/Library/LaunchDaemons/org.anyrtd.anyrtd.plist")
    assert target.domain == "system"
    assert target.config_path == Path("/usr/local/etc/anyrtd/anyrtd.toml")
    assert target.dirs == (
        (Path("/usr/local/var/anyrtd"), 0o700, "_anyrtd"),
        (Path("/usr/local/var/log/anyrtd"), 0o750, "_anyrtd"),
        (Path("/usr/local/etc/anyrtd"), 0o755, None),
    )


@pytest.mark.parametrize(
    ("place", "root", "option"),
    [
        ("/root/.pyenv/versions/3.11.7/bin/python3.11", "/root", "ProtectHome=yes"),
        ("/home/me/venv/lib/python3.11/site-packages/anyrtd", "/home", "ProtectHome=yes"),
        ("/tmp/venv/bin/anyrtd", "/tmp", "PrivateTmp=yes"),
        ("/var/tmp/venv", "/var/tmp", "PrivateTmp=yes"),
    ],
)
def test_a_place_the_hardened_unit_hides_is_found(place: str, root: str, option: str) -> None:
    installation = Installation(("/opt/anyrtd/bin/anyrtd",), (Path("/opt/anyrtd"), Path(place)))
    assert hidden_place(installation) == (Path(place), Path(root), option)
    assert hidden_place(OPT) is None
    assert hidden_place(Installation((), (Path("/homestead/anyrtd"),))) is None


# --- the refusals, no systemd needed ---------------------------------------------------------


@pytest.fixture
def tmp_launcher() -> Iterator[Path]:
    """An `anyrtd` command under /tmp: a script like the one pip writes, for this checkout."""
    base = Path(tempfile.mkdtemp(prefix="anyrtd-launcher-", dir="/tmp"))
    try:
        script = base / "bin" / "anyrtd"
        script.parent.mkdir()
        script.write_text(
            f"#!{sys.executable}\nimport sys\nfrom anyrtd.cli import main\nsys.exit(main())\n"
        )
        script.chmod(0o755)
        yield script
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize("args", [(), ("--dry-run",)], ids=["install", "dry-run"])
def test_an_installation_under_tmp_is_refused_with_the_fix(
    tmp_launcher: Path, args: tuple[str, ...]
) -> None:
    had_unit = UNIT.exists()
    done = subprocess.run(
        [str(tmp_launcher), "service", "install", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"Error: this anyrtd runs from {tmp_launcher}, under /tmp, ")
    assert "(PrivateTmp=yes hides it)" in line
    assert "sudo /usr/bin/python3 -m venv /opt/anyrtd" in line
    # What this anyrtd was installed from (this checkout, here), never a name no index has;
    # `opt_home` builds its /opt environment with the same `pip install` of the checkout.
    assert f" && sudo /opt/anyrtd/bin/pip install {REPO} && " in line
    assert "sudo /opt/anyrtd/bin/anyrtd service install` (it links /usr/local/bin/anyrtd " in line
    assert "`anyrtd service install --user`" in line
    assert UNIT.exists() == had_unit


@pytest.mark.systemd
def test_the_system_service_without_root_is_refused_with_the_fix(opt_home: Path) -> None:
    anyrtd = opt_home / "venv" / "bin" / "anyrtd"
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            anyrtd,
            "service",
            "install",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": "/nonexistent"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == (
        f"Error: the system service needs root: run `sudo {anyrtd} service install`, "
        f"or `{anyrtd} service install --user` to run anyrtd as a service of your own user"
    )


def test_a_file_that_cannot_be_written_ends_the_install_in_one_line(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "config-home"
    not_a_dir.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "anyrtd", "service", "install", "--user"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_CONFIG_HOME": str(not_a_dir)},
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"Error: {not_a_dir}/systemd/user: Not a directory (the steps printed above were done, "
        "none after)"
    ]


# --- the round trip, under the sandbox's systemd ---------------------------------------------


@pytest.fixture
def clean(systemd: Systemd) -> Iterator[None]:
    """No anyrtd installed before the test, and none after it; the state removed at the end."""
    foreign = foreign_units()
    if foreign:
        pytest.fail(
            f"an anyrtd unit no test installed is on this machine ({foreign[0]}); the test "
            "would replace it and its state: run it on a machine without anyrtd"
        )
    if CONFIG.exists() and CONFIG.read_text() != packaged(EXAMPLE_CONFIG):
        pytest.fail(f"{CONFIG} is on this machine and is not the example: the test would use it")
    if (COMMAND_LINK.exists() or COMMAND_LINK.is_symlink()) and not a_tests_link():
        pytest.fail(f"{COMMAND_LINK} is on this machine and no test made it: the test replaces it")

    def remove(created: list[Path]) -> None:
        systemd.run("systemctl", "disable", "--now", "anyrtd", check=False)
        systemd.run("systemctl", "reset-failed", "anyrtd", check=False)
        remove_installed(created)
        if a_tests_link():
            COMMAND_LINK.unlink()
        systemd.run("systemctl", "daemon-reload")

    remove([CONFIG])  # what an interrupted run of this test left behind
    created = [p for p in (CONFIG, CONFIG_DIR, STATE_PRIVATE) if not p.exists()]
    try:
        yield
    finally:
        remove(created)


def a_tests_link() -> bool:
    """Return whether the command on PATH is a link to the anyrtd of a test's /opt."""
    return COMMAND_LINK.is_symlink() and os.readlink(COMMAND_LINK).startswith("/opt/anyrtd-test-")


LINKED = ", so that `anyrtd` runs the service's anyrtd"


def service(systemd: Systemd, anyrtd: Path, *args: str, env: tuple[str, ...] = ()) -> str:
    """Run `anyrtd service ARGS` inside the sandbox (after `env`); return what it printed."""
    done = systemd.run(*env, str(anyrtd), "service", *args, check=False)
    if done.returncode != 0:
        journal = systemd.run("journalctl", "-u", "anyrtd", "-n", "30", "--no-pager", check=False)
        pytest.fail(
            f"`anyrtd service {' '.join(args)}` exited {done.returncode}:\n"
            f"{done.stdout}{done.stderr}\njournalctl -u anyrtd:\n{journal.stdout}"
        )
    assert done.stderr == ""
    return done.stdout


def healthz(systemd: Systemd) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=str(systemd.root / "run/anyrtd/control.sock"))
    with httpx.Client(transport=transport, base_url="http://localhost", timeout=10) as client:
        return client.get("/healthz")


@pytest.mark.systemd
def test_a_dry_run_says_what_it_would_do_and_changes_nothing(
    systemd: Systemd, opt_home: Path, clean: None
) -> None:
    anyrtd = opt_home / "venv" / "bin" / "anyrtd"
    out = service(systemd, anyrtd, "install", "--dry-run")
    assert f"would create {UNIT} (ExecStart={anyrtd} {SOCKET_ARGS})" in out
    assert f"would create {CONFIG} from the example config" in out
    assert "would run `systemctl daemon-reload`" in out
    assert "would run `systemctl enable --now anyrtd.service`" in out
    assert f"would link {COMMAND_LINK} to {anyrtd}{LINKED}" in out
    assert not UNIT.exists() and not CONFIG.exists()
    assert not COMMAND_LINK.is_symlink()
    assert systemd.show("anyrtd.service", "LoadState") == {"LoadState": "not-found"}


@pytest.mark.systemd
def test_install_starts_the_service_and_uninstall_removes_it_but_keeps_the_state(
    systemd: Systemd, opt_home: Path, clean: None
) -> None:
    anyrtd = opt_home / "venv" / "bin" / "anyrtd"
    props = ("LoadState", "ActiveState", "SubState", "UnitFileState", "MainPID")

    out = service(systemd, anyrtd, "install")
    assert out.splitlines()[:5] == [
        f"created {UNIT} (ExecStart={anyrtd} {SOCKET_ARGS})",
        f"created {CONFIG} from the example config",
        "  edit it (server, space, programs), then `sudo systemctl reload anyrtd`",
        "ran `systemctl daemon-reload`",
        "ran `systemctl enable --now anyrtd.service`",
    ]
    assert "Read its log with: sudo journalctl -u anyrtd -f" in out
    assert exec_start(UNIT.read_text()) == f"{anyrtd} {SOCKET_ARGS}"
    assert CONFIG.read_text() == packaged(EXAMPLE_CONFIG)
    # Type=notify: `enable --now` returned after READY=1, so the daemon answers already.
    running = systemd.show("anyrtd.service", *props)
    assert running | {"MainPID": "-"} == {
        "LoadState": "loaded",
        "ActiveState": "active",
        "SubState": "running",
        "UnitFileState": "enabled",
        "MainPID": "-",
    }
    health = healthz(systemd)
    assert health.status_code == 200, health.text
    assert health.json()["lastTickAt"] is not None
    # The client commands find it through the config file the install created, and the
    # command is on PATH, a link to the installation the service runs.
    assert f"linked {COMMAND_LINK} to {anyrtd}{LINKED}" in out
    assert Path(os.readlink(COMMAND_LINK)) == anyrtd
    listed = systemd.run(str(COMMAND_LINK), "triggers", "list", check=False)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    # The doctor reads the service's configuration: its state directory, its mirror.
    doctor = systemd.run(str(COMMAND_LINK), "doctor", "--json", check=False)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert checks["config"] == {
        "name": "config",
        "status": "ok",
        "detail": "the system service is installed: read its configuration "
        f"({CONFIG}, state in /var/lib/anyrtd)",
        "fix": None,
    }
    assert "statedir" not in checks, checks["statedir"]
    assert checks["mirror"]["status"] == "ok", checks["mirror"]
    assert checks["mirror"]["detail"].startswith("/var/lib/anyrtd/anyrtd.sqlite3 at ")

    again = service(systemd, anyrtd, "install")
    assert f"unchanged {UNIT}" in again
    assert f"kept {CONFIG}: it exists, and anyrtd never overwrites it" in again
    assert "anyrtd.service was already enabled and running" in again
    assert f"unchanged {COMMAND_LINK} (a link to {anyrtd})" in again
    assert "ran `" not in again
    assert systemd.show("anyrtd.service", "MainPID") == {"MainPID": running["MainPID"]}

    # A unit that differs from what this installation writes is put back, and the service
    # restarted on it.
    UNIT.write_text(UNIT.read_text().replace(f"ExecStart={anyrtd} ", "ExecStart=/elsewhere "))
    again = service(systemd, anyrtd, "install")
    assert again.splitlines()[:4] == [
        f"replaced {UNIT} (ExecStart={anyrtd} {SOCKET_ARGS})",
        f"kept {CONFIG}: it exists, and anyrtd never overwrites it",
        "ran `systemctl daemon-reload`",
        "ran `systemctl restart anyrtd.service`",
    ]
    restarted = systemd.show("anyrtd.service", "ActiveState", "MainPID")
    assert restarted["ActiveState"] == "active"
    assert restarted["MainPID"] not in ("0", running["MainPID"])
    assert exec_start(UNIT.read_text()) == f"{anyrtd} {SOCKET_ARGS}"

    out = service(systemd, anyrtd, "uninstall")
    assert out.splitlines() == [
        "ran `systemctl disable --now anyrtd.service`",
        f"removed {UNIT}",
        "ran `systemctl daemon-reload`",
        f"removed {COMMAND_LINK}",
        f"kept the config {CONFIG} and the state in /var/lib/anyrtd",
    ]
    gone = systemd.show("anyrtd.service", "LoadState", "ActiveState")
    assert gone == {"LoadState": "not-found", "ActiveState": "inactive"}
    assert not UNIT.exists() and not WANTS_LINK.is_symlink()
    assert not COMMAND_LINK.is_symlink()
    assert MIRROR.is_file() and CONFIG.read_text() == packaged(EXAMPLE_CONFIG)

    again = service(systemd, anyrtd, "uninstall")
    assert again.splitlines()[:2] == [
        "anyrtd.service was neither enabled nor running",
        f"no {UNIT} to remove",
    ]
    assert "ran `" not in again


def test_a_user_dry_run_names_the_user_unit_and_config(tmp_path: Path) -> None:
    # No user manager runs here: a dry run only reads, so it shows the plan all the same.
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    done = subprocess.run(
        [sys.executable, "-m", "anyrtd", "service", "install", "--user", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    python = os.path.abspath(sys.executable)
    assert done.stdout.splitlines()[:5] == [
        f"would create {tmp_path}/cfg/systemd/user/anyrtd.service "
        f"(ExecStart={python} -P -m anyrtd serve)",
        f"would create {tmp_path}/cfg/anyrtd/anyrtd.toml from the example config",
        "  edit it (server, space, programs), then `systemctl --user reload anyrtd`",
        "would run `systemctl --user daemon-reload`",
        "would run `systemctl --user enable --now anyrtd.service`",
    ]
    assert "journalctl --user -u anyrtd -f" in done.stdout
    assert not (tmp_path / "cfg").exists()


@pytest.mark.systemd
def test_uninstall_works_from_an_installation_the_unit_could_not_run(
    systemd: Systemd, tmp_launcher: Path, clean: None
) -> None:
    # Removing needs nothing of the installation: an anyrtd under /tmp may do it.
    out = service(systemd, tmp_launcher, "uninstall")
    assert out.splitlines() == [
        "anyrtd.service was neither enabled nor running",
        f"no {UNIT} to remove",
        f"kept the config {CONFIG} and the state in /var/lib/anyrtd",
    ]


USER_ENV = ("env", "-u", "XDG_CONFIG_HOME", "-u", "XDG_STATE_HOME", "XDG_RUNTIME_DIR=/run/user/0")


@pytest.fixture
def user_manager(systemd: Systemd) -> Iterator[Path]:
    """Root's user manager in the sandbox, over a /root of its own; return that /root from here.

    The tmpfs on /root is in the sandbox's mount namespace only: the machine's own /root (whose
    ~/.config/anyrtd/anyrtd.toml every anyrtd command run as root would read) is untouched.
    """
    systemd.run("mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", "/root")
    try:
        systemd.run("systemctl", "start", "user@0.service")
        yield systemd.root / "root"
    finally:
        systemd.run("systemctl", "stop", "user@0.service", check=False)
        systemd.run("umount", "--lazy", "/root")


@pytest.mark.systemd
def test_a_user_install_runs_the_user_unit_and_uninstall_removes_it(
    systemd: Systemd, opt_home: Path, user_manager: Path
) -> None:
    anyrtd = opt_home / "venv" / "bin" / "anyrtd"
    unit = Path("/root/.config/systemd/user/anyrtd.service")
    config = Path("/root/.config/anyrtd/anyrtd.toml")
    # A socket of its own rather than the default 127.0.0.1:7010, which this machine's other
    # processes may hold; the install keeps a config that is there.
    (user_manager / ".config/anyrtd").mkdir(parents=True)
    (user_manager / ".config/anyrtd/anyrtd.toml").write_text(
        'listen = "unix:/run/user/0/anyrtd-test.sock"\n'
    )

    out = service(systemd, anyrtd, "install", "--user", env=USER_ENV)
    assert out.splitlines()[:4] == [
        f"created {unit} (ExecStart={anyrtd} serve)",
        f"kept {config}: it exists, and anyrtd never overwrites it",
        "ran `systemctl --user daemon-reload`",
        "ran `systemctl --user enable --now anyrtd.service`",
    ]
    assert "Read its log with: journalctl --user -u anyrtd -f" in out
    show = [*USER_ENV, "systemctl", "--user", "show", "anyrtd.service"]
    props = ("--property=ActiveState", "--property=UnitFileState")
    assert systemd.run(*show, *props).stdout.split() == [
        "ActiveState=active",
        "UnitFileState=enabled",
    ]
    sock = systemd.root / "run/user/0/anyrtd-test.sock"
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=10) as client:
        assert client.get("http://localhost/healthz").status_code == 200

    out = service(systemd, anyrtd, "uninstall", "--user", env=USER_ENV)
    assert out.splitlines() == [
        "ran `systemctl --user disable --now anyrtd.service`",
        f"removed {unit}",
        "ran `systemctl --user daemon-reload`",
        f"kept the config {config} and the state in /root/.local/state/anyrtd",
    ]
    assert systemd.run(*show, "--property=LoadState").stdout.strip() == "LoadState=not-found"
    assert (user_manager / ".local/state/anyrtd/anyrtd.sqlite3").is_file()
