"""The words of anyrtd, spelled once: kinds, run statuses, `lastStatus` values, markers,
verdicts, trigger states, the causes of a missed occurrence, notices, the rollup's field
names and the `anyrt-<pid>` stamp.

Every other module, the OpenAPI document, the CLI's choices and the views take them from
here. `StrEnum` members are `str`s, so they compare equal to the plain words read from a
record and serialise to them in JSON.
"""

from __future__ import annotations

import re
from enum import StrEnum


class Kind(StrEnum):
    """What fires a trigger (seeds, Trigger schema)."""

    CRON = "cron"
    ONCE = "once"
    EVENT = "event"


class RunStatus(StrEnum):
    """A run's `status`: the seeds' four outcomes, and `running` while the mirror holds it open."""

    OK = "ok"
    FAILED = "FAILED"
    INCOMPLETE = "incomplete"
    INTERRUPTED = "interrupted"
    RUNNING = "running"


ENDED_STATUSES: tuple[RunStatus, ...] = (
    RunStatus.OK,
    RunStatus.FAILED,
    RunStatus.INCOMPLETE,
    RunStatus.INTERRUPTED,
)
"""The statuses a finished run can carry."""


class RunState(StrEnum):
    """Where a run is in its life (`anyrtd/lifecycle.py`, which owns the transitions); the
    mirror's `runs.state` column holds every one but `due` and `cancelled`, which have no row."""

    DUE = "due"
    """Not a run yet: its entry's next fire time."""
    PREPARED = "prepared"
    """Durable ahead of its due time; its program has not started."""
    STARTED = "started"
    """Its program started (its id is in the start journal); the start is not noted yet."""
    RUNNING = "running"
    """Its start noted: the real `startedAt`, a `once`'s consumption queued."""
    ENDED = "ended"
    """Closed with an outcome: `ok`, `FAILED`, `incomplete` or `interrupted`."""
    CANCELLED = "cancelled"
    """Taken back before its program started: its row deleted, its entry put back."""


OPEN_STATES: tuple[RunState, ...] = (RunState.PREPARED, RunState.STARTED, RunState.RUNNING)
"""The states a restart finds a run in and settles (`lifecycle.settle_at_open`)."""


class Marker(StrEnum):
    """A health marker: the record is adopted but can never fire, and `lastStatus` says why."""

    INVALID_SPEC = "invalid_spec"
    UNSUPPORTED_SOURCE = "unsupported_source"
    NOT_INSTALLED = "not_installed"


class LastStatus(StrEnum):
    """A trigger's `lastStatus` besides the markers (seeds, Trigger schema)."""

    OK = "ok"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    AUTO_DISABLED = "auto_disabled"


class Verdict(StrEnum):
    """What the election says this device is (seeds, Device pins)."""

    ACTIVE = "active"
    STANDBY = "standby"
    PRUNED = "pruned"


class TriggerState(StrEnum):
    """One word for where a trigger stands on this device (the control API's `state`, the
    list's and `why`'s), decided by `anyrtd.why.explain` from its first blocking reason."""

    SCHEDULED = "scheduled"
    LISTENING = "listening"
    RUNNING = "running"
    IDLE = "idle"
    DISABLED = "disabled"
    AUTO_DISABLED = "auto_disabled"
    CONSUMED = "consumed"
    CLAIMING = "claiming"
    CANNOT_RUN = "cannot_run"
    """It belongs here but can never run as it stands; `stateReason` says why in a word."""
    UNAVAILABLE = "unavailable"
    """A standing built-in whose program this device does not have: expected, not an alarm."""
    UNASSIGNED = "unassigned"
    PINNED_HERE = "pinned_here"
    PINNED_ELSEWHERE = "pinned_elsewhere"
    MALFORMED = "malformed"
    UNKNOWN = "unknown"
    """No record of that id (only `why` says it: a list has no row for it)."""
    DELETED = "deleted"
    """Its record was deleted (its id tombstoned); only `why` says it."""


class StateReason(StrEnum):
    """Why a trigger is `cannot_run` (or `unavailable`, or not here yet), in a word."""

    NOT_INSTALLED = "not_installed"
    INVALID_SPEC = "invalid_spec"
    UNSUPPORTED_SOURCE = "unsupported_source"
    DEVICE_PRUNED = "device_pruned"
    NO_PEER_ID = "no_peer_id"
    STANDBY = "standby"
    TAKEOVER_HOLD = "takeover_hold"
    NOT_ADOPTED = "not_adopted"
    NO_NEXT_FIRE = "no_next_fire"


class Severity(StrEnum):
    """How much a trigger's state asks of its user: the colour the page gives it."""

    OK = "ok"
    """It fires (or listens) as meant."""
    BUSY = "busy"
    """It is on its way: running, or being claimed."""
    QUIET = "quiet"
    """It does not fire here, as meant: disabled, consumed, held elsewhere, a built-in not
    shipped."""
    WARN = "warn"
    """It may need a look: enabled with nothing ahead, this device without a peer id."""
    BAD = "bad"
    """It cannot fire until someone fixes it."""


class DeviceState(StrEnum):
    """A device's row in the devices registry, as a trigger's `why` names it."""

    LIVE = "live"
    PRUNED = "pruned"
    UNKNOWN = "unknown"
    """No row for that peer id, or the registry did not answer."""


class OwnerState(StrEnum):
    """A trigger's device as the agenda shows it: what the missed watch knows of it."""

    RUNNING = "running"
    """This device, or the active one: it answers."""
    STANDBY = "standby"
    """Live in the devices registry, not the active device, not known to be silent."""
    NOT_RUNNING = "not_running"
    """Live in the registry, but the missed watch saw it record nothing since a missed
    occurrence of a trigger it holds was due."""
    PRUNED = "pruned"
    UNKNOWN = "unknown"
    """Not in the devices registry, or the registry was not read."""
    UNASSIGNED = "unassigned"
    """No device holds the trigger: the active device claims it."""


class Cause(StrEnum):
    """Why a trigger will not fire on this device, or what to know when it will (`/why`)."""

    UNKNOWN = "unknown"
    TOMBSTONED = "tombstoned"
    MALFORMED = "malformed"
    NO_PEER_ID = "no_peer_id"
    DEVICE_PRUNED = "device_pruned"
    PINNED_ELSEWHERE = "pinned_elsewhere"
    STANDBY = "standby"
    TAKEOVER_HOLD = "takeover_hold"
    NOT_ADOPTED = "not_adopted"
    CLAIMING = "claiming"
    MARKER = "marker"
    NOT_INSTALLED = "not_installed"
    AUTO_DISABLED = "auto_disabled"
    CONSUMED = "consumed"
    DISABLED = "disabled"
    NO_NEXT_FIRE = "no_next_fire"
    FAILING = "failing"
    RUNNING = "running"
    OVERLAP_SKIPS = "overlap_skips"
    MISSED = "missed"
    CHAIN = "chain"
    """A note: what a chain answers, and the upstream run its last run answered."""


class MissCause(StrEnum):
    """Why an occurrence of a trigger did not run (`GET /triggers/:id/missed`, notices)."""

    OWNER_NOT_RUNNING = "owner_not_running"
    """The owner device has recorded nothing since before the occurrence."""
    OWNER_PRUNED = "owner_pruned"
    OWNER_UNKNOWN = "owner_unknown"
    """The devices registry has no row for the owner's peer id."""
    UNASSIGNED = "unassigned"
    THIS_DEVICE_DOWN = "this_device_down"
    DISABLED = "disabled"
    AUTO_DISABLED = "auto_disabled"
    OVERLAP_SKIP = "overlap_skip"
    STALL_SKIP = "stall_skip"
    """This daemon skipped it: it came due while the daemon was stopped or its machine paused."""
    UNKNOWN = "unknown"


class NoticeKind(StrEnum):
    """What a notice tells (docs/notices.md)."""

    MISSED = "missed"
    AUTO_DISABLED = "auto_disabled"
    ONCE_FAILED = "once_failed"
    SET_ASIDE = "set_aside"
    AT_RISK = "at_risk"
    """An occurrence will be missed as things stand, a lead time before it is due."""
    AT_RISK_OVER = "at_risk_over"
    """What became of an occurrence an `at_risk` notice was made for: the risk went away,
    or it was missed (in the same thread)."""


class NoticeChannel(StrEnum):
    """Where a notice goes: a chat of the space, or a local command."""

    CHAT = "chat"
    COMMAND = "command"


class RollupField(StrEnum):
    """The rollup's field names on a trigger record (seeds, Scheduling)."""

    LAST_RUN_AT = "lastRunAt"
    LAST_STATUS = "lastStatus"
    LAST_DURATION_MS = "lastDurationMs"
    LAST_FUEL = "lastFuel"
    LAST_COST_USD = "lastCostUsd"
    RUN_COUNT = "runCount"
    CONSECUTIVE_FAILURES = "consecutiveFailures"
    LAST_RUN_REF = "lastRunRef"


class HistorySource(StrEnum):
    """Where a trigger's run history was read (the control API's `X-Anyrtd-Source`)."""

    SERVER = "server"
    MIRROR = "mirror"


SOURCE_HEADER = "X-Anyrtd-Source"
"""The control API's header that says where a list of runs was read (a `HistorySource`)."""


CHAT_WATCH_PROGRAM = "internal:chat-watch"
"""The program of the chat-watch record, the one that answers the chat (and carries the
stand-down beats of docs/election.md)."""

STAMP_PREFIX = "anyrt-"
_STAMP = re.compile(r"anyrt-[0-9]+", re.ASCII)


def stamp(pid: int) -> str:
    """Return the owner stamp of a process that has no peer id."""
    return f"{STAMP_PREFIX}{pid}"


def is_stamp(owner: str | None) -> bool:
    """Return whether `owner` is an `anyrt-<pid>` stamp, which every reader treats as unassigned."""
    return owner is not None and _STAMP.fullmatch(owner) is not None


def is_unassigned(owner: str) -> bool:
    """Return whether an `owner` value leaves the trigger to the active device to claim."""
    return owner == "" or is_stamp(owner)
