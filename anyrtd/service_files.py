"""The files `anyrtd service install` writes, rendered for the running installation.

The packaged systemd units, example config and launchd property lists ship inside the
package (`anyrtd/packaging`, the repository's `packaging/`). Here they are given the
command of the installation that runs (`ExecStart=`, `ProgramArguments`) and the places
they go to are worked out. Pure: nothing here writes a file or runs a command.
"""

from __future__ import annotations

import json
import os
import plistlib
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import escape

UNIT = "anyrtd.service"
LABEL = "org.anyrtd.anyrtd"
SYSTEM_UNIT = "systemd/anyrtd.service"
USER_UNIT = "systemd/user/anyrtd.service"
EXAMPLE_CONFIG = "systemd/anyrtd.toml.example"
LAUNCH_AGENT = "launchd/LaunchAgents/org.anyrtd.anyrtd.plist"
LAUNCH_DAEMON = "launchd/LaunchDaemons/org.anyrtd.anyrtd.plist"
PACKAGED = (SYSTEM_UNIT, USER_UNIT, EXAMPLE_CONFIG, LAUNCH_AGENT, LAUNCH_DAEMON)

SYSTEM_UNIT_PATH = Path("/etc/systemd/system") / UNIT
SYSTEM_CONFIG_PATH = Path("/etc/anyrtd/anyrtd.toml")
SYSTEM_STATE_DIR = Path("/var/lib/anyrtd")
"""Where the system unit's state goes (its StateDirectory=, which anyrtd reads as
$STATE_DIRECTORY)."""
COMMAND_LINK = Path("/usr/local/bin/anyrtd")
"""Where a system install links the `anyrtd` command it runs, so that `anyrtd` (and `sudo
anyrtd`: /usr/local/bin is in sudo's secure_path) finds the service's installation."""
ON_PATH = (COMMAND_LINK.parent, Path("/usr/bin"), Path("/bin"))
"""Directories of the command every PATH has: a command there needs no link."""

HIDDEN = (
    (Path("/root"), "ProtectHome=yes"),
    (Path("/home"), "ProtectHome=yes"),
    (Path("/run/user"), "ProtectHome=yes"),
    (Path("/tmp"), "PrivateTmp=yes"),
    (Path("/var/tmp"), "PrivateTmp=yes"),
)
"""What the hardened system unit cannot see, and the option that hides it."""

LISTEN_LINE = 'listen = "unix:/run/anyrtd/control.sock"\n'
UNIT_HEADER = (
    "# Written by `anyrtd service install` from the unit anyrtd ships, with ExecStart= set to\n"
    "# the installation that ran it. Running it again rewrites this file: put local changes\n"
    "# in a drop-in (`systemctl edit anyrtd`).\n"
    "#\n"
)
PLIST_HEADER = (
    "<!-- Written by `anyrtd service install`, with ProgramArguments set to the installation\n"
    "  that ran it. Running it again rewrites this file. -->\n"
)
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./:@+=,-]+")


class ServiceFileError(Exception):
    """A service file that cannot be rendered; the message says why."""


def packaged(name: str) -> str:
    """Return the text of a packaged service file (`systemd/anyrtd.service`, ...)."""
    return (resources.files("anyrtd") / "packaging" / name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Installation:
    """The running anyrtd: the command that starts it and the places it is read from."""

    program: tuple[str, ...]
    places: tuple[Path, ...]
    """Resolved: the executable, the interpreter, the environment and the package."""

    @classmethod
    def running(cls) -> Installation:
        """Return this process's installation: its `anyrtd` script, else `python -m anyrtd`."""
        import anyrtd

        script = Path(sys.argv[0])
        if script.name == "anyrtd" and script.is_file() and os.access(script, os.X_OK):
            program: tuple[str, ...] = (os.path.abspath(script),)
        else:  # `python -m anyrtd`; -P keeps the service's working directory off sys.path
            program = (os.path.abspath(sys.executable), "-P", "-m", "anyrtd")
        places = (program[0], sys.executable, sys.prefix, sys.base_prefix, anyrtd.__file__)
        resolved = dict.fromkeys(Path(os.path.realpath(p)) for p in places if p)
        return cls(program, tuple(resolved))


def install_source(direct_url: str | None, exists: Callable[[Path], bool] = Path.exists) -> str:
    """Return what `pip install` takes to install this anyrtd again, elsewhere.

    `direct_url` is the text of the distribution's `direct_url.json` (PEP 610), which pip
    writes when it installs from a checkout (`pip install .`, `pip install -e .`) or from a
    wheel or archive file: that path, when it is still there. Without one, anyrtd came from
    a package index, under its name.
    """
    if direct_url is None:
        return "anyrtd"
    try:
        found = json.loads(direct_url).get("url")
    except (ValueError, AttributeError):
        found = None
    url = found if isinstance(found, str) else ""
    parts = urlsplit(url)
    if parts.scheme == "file" and exists(Path(unquote(parts.path))):
        return unquote(parts.path)
    if parts.scheme in ("http", "https"):
        return url
    return "/path/to/anyrtd (a checkout of anyrtd, or its wheel)"


def command_link(installation: Installation) -> Path | None:
    """Return the `anyrtd` command of `installation` that `COMMAND_LINK` should name, or None
    when it has none (it runs as `python -m anyrtd`) or lives where every PATH finds it."""
    if len(installation.program) != 1:
        return None
    program = Path(installation.program[0])
    if program.name != "anyrtd" or program.parent in ON_PATH:
        return None
    return program


@dataclass(frozen=True)
class InstalledService:
    """A systemd service of anyrtd installed here: whose it is, and what it reads."""

    whose: str
    unit_path: Path
    config_path: Path
    state_dir: Path


def installed_service(
    *, root: bool, env: Mapping[str, str], home: Path, exists: Callable[[Path], bool] = Path.exists
) -> InstalledService | None:
    """Return the service whose configuration a command of this user should read: as root the
    system service, else the user's own, else the system's; None when neither is installed."""
    config_home = _xdg(env, home, "XDG_CONFIG_HOME", ".config")
    system = InstalledService(
        "the system service", SYSTEM_UNIT_PATH, SYSTEM_CONFIG_PATH, SYSTEM_STATE_DIR
    )
    user = InstalledService(
        "your user service",
        config_home / "systemd" / "user" / UNIT,
        config_home / "anyrtd" / "anyrtd.toml",
        _xdg(env, home, "XDG_STATE_HOME", ".local/state") / "anyrtd",
    )
    for service in (system, user) if root else (user, system):
        if exists(service.unit_path):
            return service
    return None


def hidden_place(installation: Installation) -> tuple[Path, Path, str] | None:
    """Return (place, hidden root, option) for a place the system unit cannot see, or None."""
    for place in installation.places:
        for root, option in HIDDEN:
            if place == root or root in place.parents:
                return place, root, option
    return None


def exec_word(arg: str) -> str:
    """Return `arg` as one word of a systemd `ExecStart=` line (quoted and escaped)."""
    if not arg or any(ord(c) < 32 or ord(c) == 127 for c in arg):
        raise ServiceFileError(f"cannot put {arg!r} in ExecStart=: empty or a control character")
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN_WORD.fullmatch(arg):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_unit(text: str, program: Sequence[str]) -> str:
    """Return the unit `text` with its `ExecStart=` program replaced by `program`."""
    lines = text.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith("ExecStart=")]
    if len(at) != 1:
        raise ServiceFileError(f"the unit has {len(at)} ExecStart= lines, expected one")
    _, _, rest = lines[at[0]].removeprefix("ExecStart=").partition(" ")
    lines[at[0]] = "ExecStart=" + " ".join(exec_word(a) for a in program) + " " + rest
    return UNIT_HEADER + "".join(lines)


def exec_start(unit_text: str) -> str:
    """Return the `ExecStart=` value of a unit's text."""
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            return line.removeprefix("ExecStart=")
    raise ServiceFileError("the unit has no ExecStart= line")


def user_config(example: str) -> str:
    """Return the example config for a user service: no `listen =` socket under /run."""
    if example.count(LISTEN_LINE) != 1:
        raise ServiceFileError(f"the example config has no single line {LISTEN_LINE.strip()!r}")
    return example.replace(
        LISTEN_LINE,
        "# (Commented out by `anyrtd service install`: the user service listens on the\n"
        "# default, 127.0.0.1:7010, where the client commands look.)\n# " + LISTEN_LINE,
    )


def render_plist(text: str, program: Sequence[str], home: str | None = None) -> str:
    """Return the plist `text` with its program replaced by `program` and `/Users/YOU` by `home`.

    The result is parsed back with `plistlib` and checked before it is returned.
    """
    first = re.compile(r"^(\s*)<string>/usr/local/bin/anyrtd</string>\n", re.MULTILINE)
    found = first.findall(text)
    if len(found) != 1:
        raise ServiceFileError("the plist does not start its ProgramArguments with anyrtd")
    indent = found[0]
    words = "".join(f"{indent}<string>{escape(a)}</string>\n" for a in program)
    out = first.sub(lambda _: words, text)
    if home is not None:
        out = out.replace("<string>/Users/YOU/", f"<string>{escape(home)}/")
    out = out.replace('<plist version="1.0">', PLIST_HEADER + '<plist version="1.0">', 1)
    try:
        data = plistlib.loads(out.encode("utf-8"))
    except Exception as exc:
        raise ServiceFileError(f"the rendered plist does not parse: {exc}") from None
    if not isinstance(data, dict) or data.get("Label") != LABEL:
        raise ServiceFileError(f"the rendered plist lacks the label {LABEL}")
    if data["ProgramArguments"][: len(program)] != list(program):
        raise ServiceFileError("the rendered plist does not run the given program")
    if "<string>/Users/YOU/" in out:
        raise ServiceFileError("the rendered plist still names /Users/YOU: give the home")
    return out


def plist_values(text: str) -> dict[str, Any]:
    """Return a rendered plist's keys and values."""
    data = plistlib.loads(text.encode("utf-8"))
    if not isinstance(data, dict):
        raise ServiceFileError("the plist is not a dictionary")
    return data


@dataclass(frozen=True)
class SystemdTarget:
    """Where the systemd unit and config go, and the texts that go there."""

    user: bool
    unit_path: Path
    unit_text: str
    config_path: Path
    config_text: str
    state_dir: Path

    @property
    def systemctl(self) -> tuple[str, ...]:
        return ("systemctl", "--user") if self.user else ("systemctl",)

    @property
    def journalctl(self) -> str:
        return "journalctl --user -u anyrtd" if self.user else "journalctl -u anyrtd"


def _xdg(env: Mapping[str, str], home: Path, variable: str, default: str) -> Path:
    value = env.get(variable)
    return Path(value) if value and os.path.isabs(value) else home / default


def systemd_target(
    installation: Installation, *, user: bool, env: Mapping[str, str], home: Path
) -> SystemdTarget:
    """Return the system unit's places (or with `user`, the user unit's) for `installation`."""
    example = packaged(EXAMPLE_CONFIG)
    if not user:
        return SystemdTarget(
            user=False,
            unit_path=SYSTEM_UNIT_PATH,
            unit_text=render_unit(packaged(SYSTEM_UNIT), installation.program),
            config_path=SYSTEM_CONFIG_PATH,
            config_text=example,
            state_dir=SYSTEM_STATE_DIR,
        )
    config_home = _xdg(env, home, "XDG_CONFIG_HOME", ".config")
    return SystemdTarget(
        user=True,
        unit_path=config_home / "systemd" / "user" / UNIT,
        unit_text=render_unit(packaged(USER_UNIT), installation.program),
        config_path=config_home / "anyrtd" / "anyrtd.toml",
        config_text=user_config(example),
        state_dir=_xdg(env, home, "XDG_STATE_HOME", ".local/state") / "anyrtd",
    )


@dataclass(frozen=True)
class LaunchdTarget:
    """Where the launchd plist, config and directories go, and the domain it loads into."""

    user: bool
    plist_path: Path
    plist_text: str
    config_path: Path
    config_text: str
    dirs: tuple[tuple[Path, int, str | None], ...]
    """(directory, mode, owning account or None for whoever runs the install), in order."""
    domain: str
    log_path: Path
    state_dir: Path
    account: str | None
    """The role account a LaunchDaemon runs as (it must exist); None for an agent."""

    @property
    def service(self) -> str:
        return f"{self.domain}/{LABEL}"


def launchd_target(
    installation: Installation, *, user: bool, env: Mapping[str, str], home: Path, uid: int
) -> LaunchdTarget:
    """Return the LaunchAgent's places (or without `user`, the LaunchDaemon's)."""
    config_text = user_config(packaged(EXAMPLE_CONFIG))
    if user:
        text = render_plist(packaged(LAUNCH_AGENT), installation.program, str(home))
        log = Path(str(plist_values(text)["StandardErrorPath"]))
        config_home = _xdg(env, home, "XDG_CONFIG_HOME", ".config")
        return LaunchdTarget(
            user=True,
            plist_path=home / "Library" / "LaunchAgents" / f"{LABEL}.plist",
            plist_text=text,
            config_path=config_home / "anyrtd" / "anyrtd.toml",
            config_text=config_text,
            dirs=((log.parent, 0o755, None),),
            domain=f"gui/{uid}",
            log_path=log,
            state_dir=_xdg(env, home, "XDG_STATE_HOME", ".local/state") / "anyrtd",
            account=None,
        )
    text = render_plist(packaged(LAUNCH_DAEMON), installation.program)
    plist = plist_values(text)
    argv = [str(a) for a in plist["ProgramArguments"]]
    config = Path(argv[argv.index("--config") + 1])
    state = Path(argv[argv.index("--state-dir") + 1])
    log = Path(str(plist["StandardErrorPath"]))
    account = str(plist["UserName"])
    return LaunchdTarget(
        user=False,
        plist_path=Path("/Library/LaunchDaemons") / f"{LABEL}.plist",
        plist_text=text,
        config_path=config,
        config_text=config_text,
        dirs=(
            (state, 0o700, account),
            (log.parent, 0o750, account),
            (config.parent, 0o755, None),
        ),
        domain="system",
        log_path=log,
        state_dir=state,
        account=account,
    )
