"""Configuration: a TOML file, overridden by `ANYRTD_*` variables, overridden by flags."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from anyrtd.address import AddressError, parse_listen

DEFAULT_SERVER = "http://127.0.0.1:7001"
DEFAULT_LISTEN = "127.0.0.1:7010"
SYSTEM_CONFIG = Path("/etc/anyrtd/anyrtd.toml")


class ConfigError(Exception):
    """A configuration value that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class CommandProgram:
    """A command declared in the local program table: the only commands a device will run."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True)
class NoticeSettings:
    """The `[notices]` table: where notices go (each channel off by default; docs/notices.md)."""

    chat: bool = False
    """Post each notice to a chat of the space, under the agent's name."""
    chat_id: str | None = None
    """The chat's object id; None: the space's general chat."""
    command: CommandProgram | None = None
    """A local program that gets each notice as JSON on stdin."""
    per_hour: int = 30
    """The most notices sent in any hour; the rest wait their turn."""
    retries: int = 3
    """How many more times a failed delivery is tried (1 s, 2 s, 4 s, ... apart)."""
    at_risk: bool = False
    """Make a notice before an occurrence is missed, `at_risk_lead_s` before it is due."""
    at_risk_lead_s: float = 600.0
    """How long before an occurrence at risk is due its notice is made (10 minutes)."""

    @property
    def enabled(self) -> bool:
        return self.chat or self.command is not None


@dataclass(frozen=True)
class Config:
    server: str = DEFAULT_SERVER
    space: str = "bao"
    agent_name: str = "bao"
    listen: str = DEFAULT_LISTEN
    state_dir: Path = field(default_factory=lambda: default_state_dir())
    tick_s: float = 5.0
    election_poll_s: float = 10.0
    run_timeout_s: float = 300.0
    grace_s: float = 10.0
    full_resync_s: float = 300.0
    decay_days: float = 30.0
    runs_kept_per_trigger: int = 1000
    """How many finished runs of each trigger the mirror keeps, newest first (docs/service.md,
    "How large the mirror gets"); older ones are pruned in batches as new ones end."""
    takeover_hold_s: float = 60.0
    """The longest a device that gains the active role waits for its predecessor's
    stand-down beat before it claims unassigned triggers (docs/election.md)."""
    missed_grace_s: float | None = None
    """How long after it was due an occurrence with no run counts as missed; None: one tick
    plus the run budget, at least 60 s (anyrtd/missed.py, `default_grace`)."""
    missed_lookback_s: float = 86_400.0
    """How far back missed occurrences are looked for."""
    token_file: Path | None = None
    programs: Mapping[str, CommandProgram] = field(default_factory=dict)
    notices: NoticeSettings = field(default_factory=NoticeSettings)
    source: Path | None = None

    @property
    def mirror_path(self) -> Path:
        return self.state_dir / "anyrtd.sqlite3"

    def with_overrides(self, **values: Any) -> Config:
        """Return a copy with every value that is not None replaced."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})


def default_state_dir() -> Path:
    """Return `$STATE_DIRECTORY` under systemd, else `~/.local/state/anyrtd`."""
    under_systemd = os.environ.get("STATE_DIRECTORY")
    if under_systemd:
        return Path(under_systemd.split(":")[0])
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "anyrtd"


def find_config_file(explicit: str | None, env: Mapping[str, str]) -> Path | None:
    """Return the config file to read: the flag, `ANYRTD_CONFIG`, the user's, the system's."""
    if explicit:
        return Path(explicit)
    if env.get("ANYRTD_CONFIG"):
        return Path(env["ANYRTD_CONFIG"])
    user = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "anyrtd" / "anyrtd.toml"
    for candidate in (user, SYSTEM_CONFIG):
        if candidate.is_file():
            return candidate
    return None


_ENV_KEYS = {
    "ANYRTD_SERVER": "server",
    "ANYRTD_SPACE": "space",
    "ANYRTD_LISTEN": "listen",
    "ANYRTD_STATE_DIR": "state_dir",
    "ANYRTD_TICK": "tick_s",
    "ANYRTD_RUNS_KEPT_PER_TRIGGER": "runs_kept_per_trigger",
}


def load_config(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    **flags: Any,
) -> Config:
    """Build the config from file, environment and flags, in rising order of precedence."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    source = find_config_file(path, env)
    if source is not None:
        values.update(_read_file(source))
    for var, key in _ENV_KEYS.items():
        if env.get(var):
            values[key] = env[var]
    given = {k: v for k, v in flags.items() if v is not None}
    if given:
        # A flag wins over the file, but a bad value in the file is still refused.
        _build(values, source)
    return _build({**values, **given}, source)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found; create it or drop --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None


_SET_BY = {
    "server": ("--server", "ANYRTD_SERVER"),
    "space": ("--space", "ANYRTD_SPACE"),
    "listen": ("--listen", "ANYRTD_LISTEN"),
    "state_dir": ("--state-dir", "ANYRTD_STATE_DIR"),
    "tick_s": ("--tick", "ANYRTD_TICK"),
    "election_poll_s": ("--election-poll", None),
    "runs_kept_per_trigger": ("--runs-kept-per-trigger", "ANYRTD_RUNS_KEPT_PER_TRIGGER"),
}
"""The flag and the variable that set a config key, for the messages that name the fix."""


def set_by(key: str) -> str:
    """Return where a config key's value can be given: `--tick, ANYRTD_TICK or tick_s`."""
    flag, var = _SET_BY.get(key, (None, None))
    ways = [w for w in (flag, var) if w is not None]
    return ", ".join(ways) + (" or " if ways else "") + f"{key} in the config file"


_FLOATS = {
    "tick_s",
    "election_poll_s",
    "run_timeout_s",
    "grace_s",
    "full_resync_s",
    "decay_days",
    "takeover_hold_s",
    "missed_grace_s",
    "missed_lookback_s",
}
_COUNTS = {"runs_kept_per_trigger"}
_STRINGS = {"server", "space", "agent_name", "listen"}


def _build(values: dict[str, Any], source: Path | None) -> Config:
    known = {f.name for f in fields(Config)} - {"source"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown config key {unknown[0]!r}; known keys: {', '.join(sorted(known))}"
        )
    out: dict[str, Any] = {"source": source}
    for key, raw in values.items():
        if key in _FLOATS:
            out[key] = _positive_float(key, raw)
        elif key in _COUNTS:
            out[key] = _positive_count(key, raw)
        elif key in _STRINGS:
            if not isinstance(raw, str) or not raw:
                raise ConfigError(f"config key {key}: expected a non-empty string, got {raw!r}")
            out[key] = raw
            if key == "server":
                out[key] = _server_url(raw)
            elif key == "listen":
                _listen_address(raw)
        elif key in ("state_dir", "token_file"):
            out[key] = Path(str(raw)).expanduser()
        elif key == "programs":
            out[key] = _programs(raw)
        elif key == "notices":
            out[key] = _notices(raw)
    return Config(**out)


def _positive_float(key: str, raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(
            f"config key {key}: expected a number of seconds, got {str(raw)!r}"
        ) from None
    if not value > 0 or value == float("inf"):
        example = Config.__dataclass_fields__[key].default
        if not isinstance(example, float):
            example = 60.0  # a setting whose default is computed (missed_grace_s)
        raise ConfigError(
            # str(): the same words whether the value came as a flag, a variable or TOML.
            f"config key {key}: must be a number of seconds greater than 0, got {str(raw)!r}; "
            f"give one such as {example:g} ({set_by(key)})"
        )
    return value


def _positive_count(key: str, raw: Any) -> int:
    """Return a whole number of at least 1 given as TOML, a variable or a flag."""
    text = str(raw).strip()
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and text.isascii() and text.isdigit():
        value = int(text)
    if value is None or value < 1:
        example = Config.__dataclass_fields__[key].default
        raise ConfigError(
            f"config key {key}: must be a whole number of at least 1, got {text!r}; "
            f"give one such as {example} ({set_by(key)})"
        )
    return value


def _server_url(raw: str) -> str:
    """Return the any server's URL without a trailing slash, or refuse one httpx cannot use."""
    text = raw.strip().rstrip("/")

    def refuse(why: str) -> ConfigError:
        return ConfigError(
            f"config key server: {raw!r} {why}; give a URL such as {DEFAULT_SERVER} "
            f"({set_by('server')})"
        )

    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise refuse(f"is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise refuse("has no http:// or https:// scheme")
    if not parts.hostname:
        raise refuse("names no host")
    if port == 0:
        raise refuse("has port 0")
    if parts.query or parts.fragment:
        raise refuse("has a query or fragment")
    return text


def _listen_address(raw: str) -> None:
    """Refuse a control API address the daemon could not listen on or the CLI not reach."""
    try:
        parse_listen(raw)
    except AddressError as exc:
        raise ConfigError(f"config key listen: {exc} ({set_by('listen')})") from None


def _programs(raw: Any) -> dict[str, CommandProgram]:
    if not isinstance(raw, dict):
        raise ConfigError('config table programs: expected [programs."name@v1"] tables')
    return {name: _command(entry, f'config table programs."{name}"') for name, entry in raw.items()}


_COMMAND_KEYS = ("argv", "cwd", "env")


def _command(entry: Any, where: str) -> CommandProgram:
    """Return a declared command (`argv`, `env`, `cwd`), as the program table declares one."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a table with argv = [...]")
    _refuse_unknown(entry, _COMMAND_KEYS, where)
    argv = entry.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigError(f'{where}: argv must be a non-empty list of strings, e.g. ["/bin/true"]')
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{where}: env must be a table of strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{where}: cwd must be a string")
    return CommandProgram(argv=tuple(argv), env=dict(env), cwd=cwd)


_NOTICE_KEYS = ("chat", "chat_id", "command", "per_hour", "retries", "at_risk", "at_risk_lead_s")
MAX_AT_RISK_LEAD_S = 604_800.0
"""The longest lead of the notice before the miss: the agenda's window (a week)."""


def _notices(raw: Any) -> NoticeSettings:
    """Return the `[notices]` table, or refuse it with the key at fault and an example."""
    where = "config table notices"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table, e.g. [notices] chat = true")
    _refuse_unknown(raw, _NOTICE_KEYS, where)
    chat = raw.get("chat", False)
    if not isinstance(chat, bool):
        raise ConfigError(f"{where}: chat must be true or false, got {chat!r}")
    chat_id = raw.get("chat_id")
    if chat_id is not None and (not isinstance(chat_id, str) or not chat_id.strip()):
        raise ConfigError(
            f"{where}: chat_id must be a chat's object id (a non-empty string), got {chat_id!r}; "
            "leave it out for the general chat"
        )
    command = raw.get("command")
    at_risk = raw.get("at_risk", False)
    if not isinstance(at_risk, bool):
        raise ConfigError(f"{where}: at_risk must be true or false, got {at_risk!r}")
    lead = raw.get("at_risk_lead_s", NoticeSettings.at_risk_lead_s)
    ok = isinstance(lead, int | float) and not isinstance(lead, bool)
    if not ok or not 0 < lead <= MAX_AT_RISK_LEAD_S:
        raise ConfigError(
            f"{where}: at_risk_lead_s must be a number of seconds more than 0 and at most "
            f"{MAX_AT_RISK_LEAD_S:g} (a week), e.g. 600, got {lead!r}"
        )
    return NoticeSettings(
        chat=chat,
        chat_id=chat_id,
        command=None if command is None else _command(command, f"{where}.command"),
        per_hour=_whole(raw, "per_hour", NoticeSettings.per_hour, 1),
        retries=_whole(raw, "retries", NoticeSettings.retries, 0),
        at_risk=at_risk,
        at_risk_lead_s=float(lead),
    )


def _refuse_unknown(table: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    """Refuse the first key of a table that it does not know, naming TOML's trap when the
    key is a top-level setting: every `key = value` after a `[table]` header belongs to that
    table, so a setting written below one is not a top-level setting at all."""
    unknown = sorted(set(table) - set(known))
    if not unknown:
        return
    key = unknown[0]
    message = f"{where}: unknown key {key!r}; known keys: {', '.join(sorted(known))}"
    if key in {f.name for f in fields(Config)}:
        message += (
            f"; {key} is a top-level setting, but TOML puts every key written after a "
            "[table] header into that table: move it above the first table"
        )
    raise ConfigError(message)


def _whole(raw: Mapping[str, Any], key: str, default: int, low: int) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(
            f"config table notices: {key} must be a whole number of at least {low}, got {value!r}"
        )
    return value
