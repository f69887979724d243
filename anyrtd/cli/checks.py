"""The checks of `anyrtd doctor`: each part a working set-up needs, and how to fix it."""

from __future__ import annotations

import asyncio
import zoneinfo
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from anyrtd.address import AddressError
from anyrtd.cli.control import ControlClient, ControlError, ControlUnreachable
from anyrtd.client import Dataset, ServerClient, ServerError, ServerUnavailable
from anyrtd.config import Config
from anyrtd.election import APP
from anyrtd.model import Malformed, parse_record
from anyrtd.places import TRIGGER_TYPE_KEY
from anyrtd.rows import SetAside
from anyrtd.vocab import LastStatus, Marker, RollupField

EARLIEST_PLAUSIBLE = 1_704_067_200.0  # 2024-01-01: a clock before this was never set
CLOCK_SKEW_S = 5.0
OUTBOX_NAMED = 10
"""How many set-aside outbox writes the doctor names."""


@dataclass(frozen=True)
class Check:
    """One finding: `ok`, `warn`, `fail` or `skip`, what was seen, and what to do about it."""

    name: str
    status: str
    detail: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Doctor:
    def __init__(self, config: Config, now: float) -> None:
        self.config = config
        self.now = now
        self.checks: list[Check] = []
        self.self_id: str | None = None
        self.records: list[dict[str, Any]] | None = None
        """The trigger records on the server, when they could be read."""
        self.health: Any = None
        """What the daemon's `/healthz` answered, or the error that stopped the request."""
        self.held: list[Any] | None = None
        """The triggers as the daemon's `GET /triggers` shows them, when it answered."""

    def add(self, name: str, status: str, detail: str, fix: str | None = None) -> None:
        self.checks.append(Check(name, status, detail, fix))

    async def run(self) -> list[Check]:
        # The daemon first: its state directory is the one whose mirror is checked.
        await asyncio.to_thread(self._ask_daemon)
        async with ServerClient(self.config.server, timeout=5.0) as client:
            reachable = await self._server(client)
            if reachable:
                await self._devices(client)
                newest = await self._anchor(client)
            else:
                for name in ("devices", "anchor"):
                    self.add(name, "skip", "the server is not reachable")
                newest = None
        self._triggers()
        await asyncio.to_thread(self._mirror)
        await asyncio.to_thread(self._control)
        self._clock(newest)
        return self.checks

    async def _server(self, client: ServerClient) -> bool:
        url = self.config.server
        try:
            spaces = await client.spaces()
        except ServerUnavailable as exc:
            self.add(
                "server",
                "fail",
                f"cannot reach the any server at {url} ({exc})",
                "start it (`anyrtd dev` runs a local one) or set --server / ANYRTD_SERVER",
            )
            return False
        except ServerError as exc:
            self.add("server", "fail", f"{url} answered {exc}", "check --server: is it any?")
            return False
        ids = [str(s.get("id")) for s in spaces]
        if self.config.space not in ids:
            self.add(
                "server",
                "fail",
                f"{url} has no space {self.config.space!r} (it has: {', '.join(ids) or 'none'})",
                "set --space / ANYRTD_SPACE / `space` in the config to the agent space",
            )
            return False
        self.add("server", "ok", f"{url} answers; space {self.config.space!r} is there")
        return True

    async def _devices(self, client: ServerClient) -> None:
        try:
            view = await client.devices()
        except (ServerUnavailable, ServerError) as exc:
            self.add("devices", "fail", f"the devices registry did not answer: {exc}", "retry")
            return
        if view is None:
            self.add(
                "devices",
                "warn",
                "the server has no devices registry: the election is off (single-device)",
                "nothing to do on a one-device set-up",
            )
            return
        self.self_id = view.self_id
        row = view.row(view.self_id)
        winner = view.active.get(APP)
        if row is not None and row.deleted:
            self.add(
                "devices",
                "fail",
                f"this device ({view.self_id}) is pruned: it fires nothing, pins included",
                "re-initialise this device (a fresh `any init` gives it a new peer id)",
            )
        elif row is None or APP not in row.apps:
            self.add(
                "devices",
                "warn",
                f"this device ({view.self_id}) has not registered as {APP!r} yet",
                "start `anyrtd serve`: it registers on start",
            )
        else:
            who = "this device" if winner == view.self_id else (winner or "nobody")
            self.add(
                "devices",
                "ok",
                f"{len(view.devices)} device(s); active for {APP!r}: {who}",
            )

    async def _anchor(self, client: ServerClient) -> float | None:
        space = self.config.space
        try:
            types = await client.types(space, include_hidden=True)
            type_id = next((str(t["id"]) for t in types if t.get("key") == TRIGGER_TYPE_KEY), None)
            if type_id is None:
                self.add(
                    "anchor",
                    "warn",
                    f"no {TRIGGER_TYPE_KEY!r} type in space {space!r} yet",
                    "start `anyrtd serve` (or create a trigger): the type is created on first use",
                )
                return None
            name = f"{type_id}_agent_triggers"
            listed = await client.datasets(space)
            objects = next((d.get("objectIds") or [] for d in listed if d.get("name") == name), [])
            if not objects:
                self.add(
                    "anchor",
                    "warn",
                    "the trigger anchor (bao/triggers/v1) is not resolved yet",
                    "start `anyrtd serve`: it resolves the anchor on start",
                )
                return None
            records = await client.query_all(Dataset(space, str(objects[0]), name))
        except (ServerUnavailable, ServerError) as exc:
            self.add("anchor", "fail", f"reading the trigger records failed: {exc}", "retry")
            return None
        self.records = records
        bad = [p for r in records if isinstance(p := parse_record(r), Malformed)]
        detail = f"{len(records)} trigger record(s) on the anchor {objects[0]}"
        if bad:
            ids = ", ".join(sorted(m.id for m in bad)[:5])
            self.add(
                "anchor",
                "warn",
                f"{detail}; {len(bad)} malformed and skipped: {ids}",
                f"fix them: `anyrtd triggers show {bad[0].id}` says why",
            )
        else:
            self.add("anchor", "ok", detail)
        stamps = [r["_updatedAt"] for r in records if isinstance(r.get("_updatedAt"), int | float)]
        return max(stamps) if stamps else None

    def _triggers(self) -> None:
        items: Iterable[Mapping[str, Any]] | None = self.records
        source = "on the server"
        if items is None and isinstance(self.held, list):
            items, source = [t for t in self.held if isinstance(t, Mapping)], "on this device"
        if items is None:
            self.add("triggers", "skip", "neither the server nor the daemon answered")
            return
        items = list(items)
        auto = sorted(
            str(t.get("id"))
            for t in items
            if t.get(RollupField.LAST_STATUS) == LastStatus.AUTO_DISABLED
            and t.get("enabled") is False
        )
        invalid = sorted(
            str(t.get("id")) for t in items if t.get(RollupField.LAST_STATUS) == Marker.INVALID_SPEC
        )
        if not auto and not invalid:
            self.add(
                "triggers",
                "ok",
                f"{len(items)} trigger(s) {source}; none auto-disabled or invalid_spec",
            )
            return
        found = []
        if auto:
            found.append(f"auto-disabled after repeated failures: {', '.join(auto)}")
        if invalid:
            found.append(f"invalid_spec (can never fire): {', '.join(invalid)}")
        first = (auto or invalid)[0]
        then = f"`anyrtd triggers enable {first}`" if auto else f"`anyrtd triggers edit {first}`"
        self.add(
            "triggers",
            "warn",
            f"{len(items)} trigger(s) {source}; " + "; ".join(found),
            f"`anyrtd triggers show {first}` says why; fix it, then {then}",
        )

    def _mirror(self) -> None:
        from anyrtd.mirror import Mirror

        path = self.config.mirror_path
        ran = self.health.get("stateDir") if isinstance(self.health, dict) else None
        if isinstance(ran, str) and ran and Path(ran) != self.config.state_dir:
            # The daemon's own state directory is the one that matters, not this command's.
            path = self.config.with_overrides(state_dir=Path(ran)).mirror_path
            self.add(
                "statedir",
                "warn",
                f"the daemon uses {ran}, this command {self.config.state_dir}; the mirror "
                "checked is the daemon's",
                "give the CLI the daemon's --state-dir (or ANYRTD_STATE_DIR) to read the same "
                "mirror",
            )
        if not path.exists():
            self.add(
                "mirror",
                "warn",
                f"no mirror at {path} yet",
                "start `anyrtd serve` (it creates it), or check --state-dir",
            )
            return
        try:
            mirror = Mirror(path)
            try:
                current, head = mirror.revisions()
                outbox = (
                    (mirror.outbox_depth(), mirror.outbox_set_aside(limit=OUTBOX_NAMED))
                    if current == head
                    else None
                )
            finally:
                mirror.close()
        except PermissionError as exc:
            self.add(
                "mirror",
                "warn",
                f"{path} cannot be read as this user: {exc}",
                "run the doctor as the daemon's user (e.g. `sudo -u anyrtd anyrtd doctor`)",
            )
            return
        except Exception as exc:  # a damaged file must not crash the doctor
            self.add("mirror", "fail", f"{path} cannot be read: {exc}", "move it away and restart")
            return
        if current == head:
            self.add("mirror", "ok", f"{path} at schema revision {head}")
            if outbox is not None:
                self._outbox(path, *outbox)
        else:
            self.add(
                "mirror",
                "fail",
                f"{path} is at revision {current or 'empty'}, this anyrtd needs {head}",
                "run `anyrtd db upgrade`",
            )

    def _outbox(self, path: Path, depth: int, aside: list[SetAside]) -> None:
        waiting = f"{depth} write(s) waiting for the server"
        if not aside:
            self.add("outbox", "ok", f"{waiting}; none set aside")
            return
        named = "; ".join(f"{a.dataset} {a.record_id} ({a.error})" for a in aside)
        more = " ..." if len(aside) == OUTBOX_NAMED else ""
        self.add(
            "outbox",
            "warn",
            f"{waiting}; write(s) the server can never take, set aside (kept, not sent): "
            f"{named}{more}",
            "nothing blocks the writes behind them; to look at them: sqlite3 -readonly "
            f"{path} 'SELECT * FROM outbox WHERE set_aside_at IS NOT NULL'",
        )

    def _ask_daemon(self) -> None:
        try:
            with ControlClient(self.config.listen, token_file=self.config.token_file) as ctl:
                self.health = ctl.request("GET", "/healthz", ok=(503,))
                if isinstance(self.health, dict):
                    try:
                        self.held = ctl.request("GET", "/triggers")
                    except ControlError:
                        self.held = None  # the triggers check falls back to the server's
        except (ControlUnreachable, ControlError, AddressError) as exc:
            self.health = exc

    def _control(self) -> None:
        health = self.health
        if isinstance(health, Exception):
            self.add("control", "fail", str(health), "start `anyrtd serve`, or set --listen")
            return
        if not isinstance(health, dict):
            self.add("control", "fail", f"{self.config.listen} is not an anyrtd control API")
            return
        status = health.get("status")
        age = health.get("lastTickAgeS")
        if status == "ok":
            detail = f"daemon at {self.config.listen} ticking (last tick {age}s ago)"
            peer = health.get("peerId")
            if self.self_id and peer and peer != self.self_id:
                self.add(
                    "control",
                    "warn",
                    f"{detail}, but as peer {peer} while the server says this device is "
                    f"{self.self_id}",
                    "point the daemon and the CLI at the same server (--server)",
                )
            else:
                self.add("control", "ok", detail)
        elif status == "degraded":
            self.add(
                "control",
                "warn",
                f"daemon at {self.config.listen} ticking, degraded: "
                + "; ".join(str(r) for r in health.get("reasons") or ()),
                "see the daemon's log (`journalctl -u anyrtd`)",
            )
        else:
            self.add(
                "control",
                "fail",
                f"daemon at {self.config.listen} is {status} (last tick {age}s ago)",
                "see the daemon's log (`journalctl -u anyrtd`)",
            )

    def _clock(self, newest: float | None) -> None:
        if self.now < EARLIEST_PLAUSIBLE:
            self.add("clock", "fail", "this machine's clock is not set", "enable NTP (timedatectl)")
            return
        if newest is not None and newest > self.now + CLOCK_SKEW_S:
            self.add(
                "clock",
                "fail",
                f"a record was written {newest - self.now:.0f}s in this machine's future: "
                "the clock is behind the server's",
                "sync the clock (e.g. `timedatectl set-ntp true`)",
            )
            return
        try:
            zones = zoneinfo.available_timezones()
        except Exception:
            zones = set()
        if not zones:
            self.add(
                "clock",
                "warn",
                "no time zone database: cron specs with a tz are marked invalid_spec",
                "install tzdata (`pip install tzdata` or the system package)",
            )
            return
        self.add("clock", "ok", "the clock is set and the time zone database is there")


async def diagnose(config: Config, now: float) -> list[Check]:
    """Run every check and return the findings in order."""
    return await _Doctor(config, now).run()
