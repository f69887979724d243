"""`anyrtd service install` and `uninstall`: run this installation under systemd or launchd.

What goes where comes from `anyrtd.service_files` (pure); this module checks that it can
be done, writes the files, runs `systemctl` or `launchctl`, and says what it changed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from anyrtd.cli.shared import echo

if TYPE_CHECKING:
    from anyrtd.cli.shared import Shared
    from anyrtd.config import Config
    from anyrtd.service_files import Installation, LaunchdTarget, SystemdTarget

USER_OPTION = click.option(
    "--user",
    is_flag=True,
    help="The per-user service (systemctl --user, or a LaunchAgent on macOS), no root needed.",
)
DRY_RUN_OPTION = click.option(
    "--dry-run", is_flag=True, help="Print what would be done; change nothing."
)


class Steps:
    """Carry out (or with `dry_run`, only describe) the changes, one line for each."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run

    def say(self, line: str) -> None:
        echo(line)

    def put(self, path: Path, text: str, *, keep: bool = False, what: str = "") -> bool:
        """Write `text` to `path` (0644) unless it holds it already, or exists and `keep`."""
        if path.exists() and keep:
            self.say(f"kept {path}: it exists, and anyrtd never overwrites it")
            return False
        old = path.read_text(encoding="utf-8", errors="replace") if path.exists() else None
        if old == text:
            self.say(f"unchanged {path}")
            return False
        verb = "create" if old is None else "replace"
        if self.dry_run:
            self.say(f"would {verb} {path}{what}")
            return True
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.anyrtd-new")
        partial.write_text(text, encoding="utf-8")
        partial.chmod(0o644)
        partial.replace(path)
        self.say(f"{verb}d {path}{what}")
        return True

    def make_dir(self, path: Path, mode: int, owner: str | None) -> None:
        if path.is_dir():
            return
        if self.dry_run:
            self.say(f"would create the directory {path}")
            return
        path.mkdir(mode=mode, parents=True)
        if owner is not None:  # a role account, with a group of the same name
            import shutil

            shutil.chown(path, owner, owner)
        self.say(f"created the directory {path}")

    def link(self, path: Path, to: Path, what: str = "") -> None:
        """Make `path` a symbolic link to `to`, replacing a link that is there."""
        if self.dry_run:
            self.say(f"would link {path} to {to}{what}")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.anyrtd-new")
        partial.unlink(missing_ok=True)
        partial.symlink_to(to)
        partial.replace(path)
        self.say(f"linked {path} to {to}{what}")

    def remove(self, path: Path) -> bool:
        if not path.exists():
            self.say(f"no {path} to remove")
            return False
        if self.dry_run:
            self.say(f"would remove {path}")
            return True
        path.unlink()
        self.say(f"removed {path}")
        return True

    def run(self, *argv: str, why: str = "") -> None:
        """Run a command that changes something; a failure ends the command with its output."""
        line = shlex.join(argv)
        if self.dry_run:
            self.say(f"would run `{line}`")
            return
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split()) or "no output"
            raise click.ClickException(f"`{line}` failed (exit {done.returncode}): {said}{why}")
        self.say(f"ran `{line}`")


def ask(*argv: str) -> str:
    """Run a command that only reads and return what it printed (empty when it cannot run)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError:
        return ""
    return done.stdout.strip()


def need_root(user: bool, dry_run: bool, installation: Installation, action: str) -> None:
    if user or dry_run or os.geteuid() == 0:
        return
    again = shlex.join([*installation.program, "service", action])
    mine = "to run anyrtd as" if action == "install" else "for"
    raise click.ClickException(
        f"the system service needs root: run `sudo {again}`, "
        f"or `{again} --user` {mine} a service of your own user"
    )


def installed_from() -> str:
    """Return what `pip install` takes to install this anyrtd again: the checkout or the
    wheel it was installed from, or its name on an index."""
    from importlib import metadata

    import anyrtd
    from anyrtd.service_files import install_source

    try:
        direct_url = metadata.distribution("anyrtd").read_text("direct_url.json")
    except metadata.PackageNotFoundError:  # run from a checkout, not installed at all
        checkout = Path(anyrtd.__file__).resolve().parent.parent
        if (checkout / "pyproject.toml").is_file():
            return str(checkout)
        direct_url = None
    return install_source(direct_url)


def refuse_hidden(installation: Installation) -> None:
    """Refuse an installation the hardened system unit cannot see, naming the fix."""
    from anyrtd.service_files import COMMAND_LINK, hidden_place

    hidden = hidden_place(installation)
    if hidden is None:
        return
    place, root, option = hidden
    source = installed_from()
    if source.startswith("/") and " " not in source:
        source = shlex.quote(source)
    raise click.ClickException(
        f"this anyrtd runs from {place}, under {root}, which the hardened system unit cannot "
        f"see ({option} hides it). Install anyrtd outside /root, /home and /tmp, from the "
        "system's Python, and run the install from there: `sudo /usr/bin/python3 -m venv "
        f"/opt/anyrtd && sudo /opt/anyrtd/bin/pip install {source} && sudo "
        f"/opt/anyrtd/bin/anyrtd service install` (it links {COMMAND_LINK} to that anyrtd); "
        "or run it as your own service: `anyrtd service install --user`"
    )


@click.group()
def service() -> None:
    """Install anyrtd as a service (systemd or launchd), or remove it."""


@service.command()
@USER_OPTION
@DRY_RUN_OPTION
def install(user: bool, dry_run: bool) -> None:
    """Install, enable and start the service that runs this anyrtd.

    Writes the packaged systemd unit (or launchd plist) pointing at this installation,
    creates the config file from the example when there is none (never overwriting it),
    and starts the service. Running it again changes only what differs.
    """
    carry_out(dry_run, user, install_systemd, install_launchd)


@service.command()
@USER_OPTION
@DRY_RUN_OPTION
def uninstall(user: bool, dry_run: bool) -> None:
    """Stop, disable and remove the service; keep its config and state."""
    carry_out(dry_run, user, uninstall_systemd, uninstall_launchd)


Action = Callable[["Steps", "Installation", bool], None]


def carry_out(dry_run: bool, user: bool, on_linux: Action, on_macos: Action) -> None:
    """Run the action for this platform's service manager; a failure ends it in one line."""
    from anyrtd.service_files import Installation, ServiceFileError

    if sys.platform == "darwin":
        action = on_macos
    elif sys.platform.startswith("linux"):
        action = on_linux
    else:
        raise click.ClickException(f"anyrtd knows no service manager on {sys.platform}")
    try:
        action(Steps(dry_run), Installation.running(), user)
    except ServiceFileError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise click.ClickException(
            f"{where}{exc.strerror or exc} (the steps printed above were done, none after)"
        ) from None


# --- systemd -------------------------------------------------------------------------------


def systemd_for(
    installation: Installation, user: bool, dry_run: bool, action: str
) -> SystemdTarget:
    """Return the target after the checks that must pass before anything changes."""
    import shutil

    from anyrtd.service_files import systemd_target

    if not user and action == "install":
        refuse_hidden(installation)
    need_root(user, dry_run, installation, action)
    if shutil.which("systemctl") is None:
        raise click.ClickException("no systemctl here: this machine does not run systemd")
    if not user and not Path("/run/systemd/system").is_dir():
        raise click.ClickException(
            "systemd is not running here (no /run/systemd/system): start anyrtd another "
            "way, such as `anyrtd serve` under your own supervisor"
        )
    return systemd_target(installation, user=user, env=os.environ, home=Path.home())


def install_systemd(steps: Steps, installation: Installation, user: bool) -> None:
    from anyrtd.service_files import UNIT, exec_start

    target = systemd_for(installation, user, steps.dry_run, "install")
    ctl = target.systemctl
    sudo = "" if user else "sudo "
    was_enabled = ask(*ctl, "is-enabled", UNIT) == "enabled"
    was_active = ask(*ctl, "is-active", UNIT) == "active"
    changed = steps.put(
        target.unit_path, target.unit_text, what=f" (ExecStart={exec_start(target.unit_text)})"
    )
    created = steps.put(
        target.config_path, target.config_text, keep=True, what=" from the example config"
    )
    if created:
        steps.say(
            f"  edit it (server, space, programs), then `{sudo}{shlex.join(ctl)} reload anyrtd`"
        )
    why = (
        f"; see `{sudo}{target.journalctl} -n 50` for why, fix it, and run "
        "`anyrtd service install` again"
    )
    if changed:
        steps.run(*ctl, "daemon-reload")
    if not was_enabled or not was_active:
        steps.run(*ctl, "enable", "--now", UNIT, why=why)
    elif changed:
        steps.run(*ctl, "restart", UNIT, why=why)
    else:
        steps.say(f"{UNIT} was already enabled and running")
    if user:
        steps.say('to keep it running while you are logged out: `loginctl enable-linger "$USER"`')
    else:
        link_command(steps, installation)
    state = "would be" if steps.dry_run else "is"
    steps.say(f"{UNIT} {state} enabled and running.")
    steps.say(f"Read its log with: {sudo}{target.journalctl} -f")
    steps.say(f"Its status: {sudo}{shlex.join(ctl)} status anyrtd")


def uninstall_systemd(steps: Steps, installation: Installation, user: bool) -> None:
    from anyrtd.service_files import UNIT

    target = systemd_for(installation, user, steps.dry_run, "uninstall")
    ctl = target.systemctl
    enabled = ask(*ctl, "is-enabled", UNIT) == "enabled"
    active = ask(*ctl, "is-active", UNIT) in ("active", "activating", "reloading")
    if target.unit_path.exists() and (enabled or active):
        steps.run(*ctl, "disable", "--now", UNIT)
    elif active:
        steps.run(*ctl, "stop", UNIT)
    else:
        steps.say(f"{UNIT} was neither enabled nor running")
    ran = unit_program(target.unit_path)
    if steps.remove(target.unit_path):
        steps.run(*ctl, "daemon-reload")
    if not user:
        unlink_command(steps, installation, ran)
    drop_ins = target.unit_path.with_name(f"{UNIT}.d")
    if drop_ins.is_dir():
        steps.say(f"kept the drop-ins in {drop_ins}")
    steps.say(f"kept the config {target.config_path} and the state in {target.state_dir}")


def link_command(steps: Steps, installation: Installation) -> None:
    """Link the command on PATH to the installation the system service runs (a link that
    is there is replaced; a file that is not a link is kept)."""
    from anyrtd.service_files import COMMAND_LINK, command_link

    program = command_link(installation)
    if program is None:
        return
    if COMMAND_LINK.is_symlink() and Path(os.readlink(COMMAND_LINK)) == program:
        steps.say(f"unchanged {COMMAND_LINK} (a link to {program})")
    elif COMMAND_LINK.exists() and not COMMAND_LINK.is_symlink():
        steps.say(
            f"kept {COMMAND_LINK}: it is not a link; the service's anyrtd is {program} "
            "(run it by that path)"
        )
    else:
        steps.link(COMMAND_LINK, program, what=", so that `anyrtd` runs the service's anyrtd")


def unit_program(unit_path: Path) -> Path | None:
    """Return the program the installed unit at `unit_path` runs, if it can be read."""
    from anyrtd.service_files import ServiceFileError, exec_start

    try:
        words = shlex.split(exec_start(unit_path.read_text(encoding="utf-8")))
    except (OSError, ServiceFileError, ValueError):
        return None
    return Path(words[0]) if words else None


def unlink_command(steps: Steps, installation: Installation, ran: Path | None) -> None:
    """Remove the link on PATH when it names this installation or the one the unit ran."""
    from anyrtd.service_files import COMMAND_LINK, command_link

    if not COMMAND_LINK.is_symlink():
        return
    to = Path(os.readlink(COMMAND_LINK))
    if to in (command_link(installation), ran):
        steps.remove(COMMAND_LINK)
    else:
        steps.say(f"kept {COMMAND_LINK}: it links to {to}, another anyrtd")


# --- doctor --------------------------------------------------------------------------------


def service_config(config: Config, given: Shared, env: Mapping[str, str]) -> tuple[Config, str]:
    """Return the config of the service installed here and how it was found, for a command
    that reads what the service does (`anyrtd doctor`); `config` as it is when the command was
    given a config file and a state directory, or no service is installed."""
    from anyrtd.cli.shared import BadSetting
    from anyrtd.config import ConfigError, default_state_dir, load_config
    from anyrtd.service_files import installed_service

    chose_file = bool(given.config_path or env.get("ANYRTD_CONFIG"))
    chose_state = bool(given.state_dir or env.get("ANYRTD_STATE_DIR"))
    found = None
    if not (chose_file and chose_state):
        found = installed_service(root=os.geteuid() == 0, env=env, home=Path.home())
    if found is None:
        return config, ""
    path = given.config_path
    if not chose_file and found.config_path.is_file():
        path = str(found.config_path)
    try:
        read = load_config(
            path,
            env,
            server=given.server,
            space=given.space,
            listen=given.listen,
            state_dir=given.state_dir,
        )
    except ConfigError as exc:
        raise BadSetting(str(exc)) from None
    if not chose_state and read.state_dir == default_state_dir():
        read = read.with_overrides(state_dir=found.state_dir)
    where = str(read.source) if read.source is not None else "no config file"
    said = f"{found.whose} is installed: read its configuration ({where}, state in "
    return read, f"{said}{read.state_dir})"


# --- launchd -------------------------------------------------------------------------------


def launchd_for(
    installation: Installation, user: bool, dry_run: bool, action: str
) -> LaunchdTarget:
    import pwd

    from anyrtd.service_files import launchd_target

    need_root(user, dry_run, installation, action)
    target = launchd_target(
        installation, user=user, env=os.environ, home=Path.home(), uid=os.getuid()
    )
    if target.account is not None and action == "install":
        try:
            pwd.getpwnam(target.account)
        except KeyError:
            raise click.ClickException(
                f"the LaunchDaemon runs as the role account {target.account}, which does not "
                "exist: create it first (the dscl commands in anyrtd's "
                "packaging/launchd/README.md), or use `anyrtd service install --user`"
            ) from None
    return target


def loaded(target: LaunchdTarget) -> bool:
    """Return whether launchd has the service loaded in the target's domain."""
    done = subprocess.run(
        ["launchctl", "print", target.service], capture_output=True, stdin=subprocess.DEVNULL
    )
    return done.returncode == 0


def install_launchd(steps: Steps, installation: Installation, user: bool) -> None:
    target = launchd_for(installation, user, steps.dry_run, "install")
    for path, mode, owner in target.dirs:
        steps.make_dir(path, mode, owner)
    created = steps.put(
        target.config_path, target.config_text, keep=True, what=" from the example config"
    )
    if created:
        steps.say("  edit it (server, space, programs); anyrtd reads it again on SIGHUP")
    was_loaded = loaded(target)
    changed = steps.put(target.plist_path, target.plist_text)
    if was_loaded and changed:
        steps.run("launchctl", "bootout", target.service)
    if changed or not was_loaded:
        steps.run("launchctl", "bootstrap", target.domain, str(target.plist_path))
    else:
        steps.say(f"{target.service} was already loaded")
    sudo = "" if user else "sudo "
    steps.say(f"Read its log with: tail -f {target.log_path}")
    steps.say(f"Its state: {sudo}launchctl print {target.service}")


def uninstall_launchd(steps: Steps, installation: Installation, user: bool) -> None:
    target = launchd_for(installation, user, steps.dry_run, "uninstall")
    if loaded(target):
        steps.run("launchctl", "bootout", target.service)
    else:
        steps.say(f"{target.service} was not loaded")
    steps.remove(target.plist_path)
    steps.say(
        f"kept the config {target.config_path}, the state in {target.state_dir} "
        f"and the log {target.log_path}"
    )
