"""The port the daemon's readers use: the control API and the chat responder.

They ask for what they show (triggers, runs, health, metrics, the election) and send two
commands (write-through, run-now); they never reach into the daemon. `DaemonPort`
(anyrtd/daemon_port.py, the daemon's `port`) implements this protocol; the control API's
tests also run against a small fake of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from anyrtd.agenda import Agenda
from anyrtd.client import Reach
from anyrtd.firing import CannotRun, NotDurable, TooManyRuns
from anyrtd.history import TRIGGER_RUNS, RunHistory
from anyrtd.metrics import Stats
from anyrtd.missed import Missed
from anyrtd.model import Malformed, TriggerDef
from anyrtd.registry import Entry
from anyrtd.rows import RunRow
from anyrtd.watch import MissedFacts
from anyrtd.why import Answer, Here


def _runs_by_hand(_entry: Entry) -> str | None:
    """Refuse no run by hand."""
    return None


@dataclass(frozen=True)
class Triggers:
    """Every trigger this device knows, as of `now`: registry entries and parsed records."""

    entries: Mapping[str, Entry]
    parsed: Mapping[str, TriggerDef | Malformed]
    raw: Callable[[str], Mapping[str, Any] | None]
    """The record as the server showed it (for records that did not parse)."""
    peer_id: str | None
    now: float
    missed: Mapping[str, Missed] = field(default_factory=dict)
    """The triggers that missed occurrences at the missed watch's last pass, by id."""
    missed_totals: Mapping[str, int] = field(default_factory=dict)
    """Missed occurrences counted since the daemon started, by trigger id."""
    refusal: Callable[[Entry], str | None] = _runs_by_hand
    """Why a run by hand of an entry could only fail here (`Firing.refusal`), or None."""
    here: Here = field(default_factory=Here)
    """What this device is (its verdict, claims, programs), as each trigger's state reads it."""


@dataclass(frozen=True)
class TriggerFacts:
    """What this device knows of one trigger, as of `now`."""

    id: str
    entry: Entry | None
    parsed: TriggerDef | Malformed | None
    raw: Mapping[str, Any] | None
    peer_id: str | None
    now: float
    refusal: Callable[[Entry], str | None] = _runs_by_hand
    """Why a run by hand of an entry could only fail here (`Firing.refusal`), or None."""
    here: Here = field(default_factory=Here)
    """What this device is, as the trigger's state reads it."""

    @property
    def run_refused(self) -> str | None:
        """Why a run by hand of this trigger could only fail here (None: it can run, or it
        is not in this device's registry)."""
        return None if self.entry is None else self.refusal(self.entry)


@dataclass(frozen=True)
class Health:
    """How the daemon's loops are doing."""

    now: float
    last_tick_at: float | None
    last_tick_age: float | None
    """Seconds since the last tick ended (monotonic clock); None before the first."""
    tick_s: float
    peer_id: str | None
    verdict: str
    triggers: int
    """Registry entries."""
    server_resolved: bool
    last_error: str | None
    degraded: tuple[str, ...] = ()
    """Why the daemon is doing its job only in part (each reason one line); empty when not."""
    state_dir: str | None = None
    """The state directory this daemon uses (its mirror and lock are there)."""


OUTBOX_BACKLOG = 1000
"""An outbox this deep is a reason to say `degraded` even while the server answers."""


def server_reasons(reach: Reach, outbox_depth: int) -> list[str]:
    """Return the reasons for `degraded` that the server gives: unreachable, answers that are
    not the any server's (or 429s), a growing outbox."""
    reasons = []
    if reach.unreachable_since is not None:
        since = datetime.fromtimestamp(reach.unreachable_since, UTC)
        reasons.append(
            f"server unreachable since {since:%Y-%m-%dT%H:%M:%SZ} ({reach.error}); "
            "firing from the mirror, writes wait in the outbox"
        )
    if reach.faulty_since is not None:
        since = datetime.fromtimestamp(reach.faulty_since, UTC)
        reasons.append(
            f"server answers badly since {since:%Y-%m-%dT%H:%M:%SZ} ({reach.fault}); "
            "firing from the mirror, writes wait in the outbox"
        )
    away = reach.unreachable_since is not None or reach.faulty_since is not None
    if outbox_depth and (away or outbox_depth >= OUTBOX_BACKLOG):
        reasons.append(f"{outbox_depth} writes waiting in the outbox for the server")
    return reasons


@dataclass(frozen=True)
class Metrics:
    """What the metrics exposition shows besides the trigger states."""

    stats: Stats
    outbox_depth: int
    verdict: str
    last_tick_age: float | None
    peer_id: str | None
    outbox_set_aside: int = 0
    """Writes the server can never take, kept in the mirror and no longer sent."""


class Port(Protocol):
    """The queries and commands the control API and the chat responder use."""

    @property
    def peer_id(self) -> str | None:
        """This device's peer id (None until the server or the mirror told it)."""
        ...

    def triggers(self) -> Triggers:
        """Return every registry entry and every record this device knows."""
        ...

    def trigger(self, trigger_id: str) -> TriggerFacts | None:
        """Return what this device knows of one trigger; None when it knows nothing."""
        ...

    async def runs(
        self, *, trigger_id: str | None = None, status: str | None = None, limit: int = 50
    ) -> Sequence[RunRow]:
        """Return the newest runs on this device, newest first."""
        ...

    async def trigger_runs(
        self, trigger_id: str, /, *, status: str | None = None, limit: int = TRIGGER_RUNS
    ) -> RunHistory:
        """Return a trigger's newest runs on every device (the server's `agent_runs`, with this
        device's runs not yet synced laid over), or this device's alone when the server is
        away; the answer says which."""
        ...

    async def run(self, run_id: str) -> RunRow | None:
        """Return one run on this device; one still running with its output so far."""
        ...

    async def missed(self, trigger_id: str) -> MissedFacts:
        """Return a trigger's missed occurrences as of now (anyrtd/missed.py), its runs on every
        device answering the occurrences they ran."""
        ...

    def agenda(self, hours: float, device: str | None = None) -> Agenda:
        """Return the space's agenda for the next `hours` (anyrtd/agenda.py), of one device
        (peer id or name) or all."""
        ...

    async def why(self, trigger_id: str) -> Answer:
        """Return whether a trigger fires on this device and, if not, every reason (why.py)."""
        ...

    async def give_way(self) -> None:
        """Let a start due soon and the event loop's other work go first: a long answer (the
        list of 10,000 triggers) calls it between its slices."""
        ...

    def health(self) -> Health:
        """Return how the loops are doing."""
        ...

    async def metrics(self) -> Metrics:
        """Return the counters and gauges of the metrics exposition."""
        ...

    def election(self) -> dict[str, Any]:
        """Return this device's verdict as the gate holds it."""
        ...

    async def write_through(
        self, trigger_id: str, fields: Mapping[str, Any], unset: Iterable[str] = ()
    ) -> TriggerDef | None:
        """Write fields of a trigger record on the server now, then reconcile it here."""
        ...

    async def run_now(self, trigger_id: str) -> str | None:
        """Run a registry entry now, outside its schedule; return the run id. Raise
        `CannotRun` when the run could only fail here, and `TooManyRuns` when too many
        manual runs are in flight already."""
        ...


__all__ = [
    "CannotRun",
    "Health",
    "Metrics",
    "MissedFacts",
    "NotDurable",
    "Port",
    "TooManyRuns",
    "TriggerFacts",
    "Triggers",
    "server_reasons",
]
