"""The rows the daemon keeps in its mirror: a registry entry's state, a run summary, a write
set aside, a notice, and the batch of them that one step commits (plain data, no SQL)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from anyrtd.client import Upsert
from anyrtd.vocab import RunState, RunStatus


@dataclass(slots=True)
class EntryRow:
    """The persisted state of one registry entry."""

    trigger_id: str
    fingerprint: str
    kind: str
    enabled: bool
    armed_at: float
    next_fire: float | None
    consumed: bool = False
    consecutive_failures: int = 0
    run_count: int = 0
    marker: str | None = None
    claimed_at: float | None = None


@dataclass(slots=True)
class RunRow:
    """A run summary as the mirror keeps it, with the captured output."""

    run_id: str
    trigger_id: str | None
    program: str
    device: str
    scheduled_at: float | None
    started_at: float
    """When its program started; while `prepared`, when it is to start (its due time, or
    the prepare's time for a batch already late)."""
    status: str = RunStatus.RUNNING
    ended_at: float | None = None
    duration_ms: int | None = None
    error_type: str | None = None
    error: str | None = None
    result: Mapping[str, Any] = field(default_factory=dict)
    output: str = ""
    output_dropped: int = 0
    process_group: int | None = None
    """A command's process group while it runs, so a restart after a crash can stop it."""
    process_start: str | None = None
    """What tells that group's leader from a later process with the same id (boot and start)."""
    state: str = ""
    """Where the run is in its life (`RunState`; `anyrtd/lifecycle.py` moves it). Left out,
    it follows from `status`: `running` while that is `running`, else `ended` (a run read
    from a server record)."""
    upstream_run_id: str | None = None
    """The run a chain's run answers (docs/events.md, "Chains"); None for any other run."""
    chain_depth: int = 0
    """How many chains in a row led to this run: 0 for a run no chain started."""

    def __post_init__(self) -> None:
        if not self.state:
            self.state = RunState.RUNNING if self.status == RunStatus.RUNNING else RunState.ENDED


@dataclass(frozen=True, slots=True)
class SetAside:
    """A write the server can never take: kept in the outbox, no longer sent."""

    seq: int
    dataset: str
    record_id: str
    set_aside_at: float
    error: str


@dataclass(frozen=True)
class NoticeRow:
    """A notice this device sent or is sending (docs/notices.md): the channels left to try."""

    key: str
    kind: str
    trigger_id: str | None
    created_at: float
    notice: Mapping[str, Any]
    """The notice as its JSON says it."""
    pending: tuple[str, ...]
    """The channels not delivered yet; empty once every one was, or was given up."""
    attempts: int = 0
    next_try_at: float | None = None
    last_error: str | None = None


@dataclass(slots=True)
class Batch:
    """Everything one step of the daemon writes, committed as one transaction."""

    records: list[tuple[str, int | None, Mapping[str, Any]]] = field(default_factory=list)
    forget_records: list[str] = field(default_factory=list)
    entries: list[EntryRow] = field(default_factory=list)
    evict: list[str] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)
    runs: list[RunRow] = field(default_factory=list)
    outbox: list[Upsert] = field(default_factory=list)
    drop_runs: list[str] = field(default_factory=list)
    """Runs cancelled before their start, or found never started at a restart: their rows go."""
    meta: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(
            (
                self.records,
                self.forget_records,
                self.entries,
                self.evict,
                self.tombstones,
                self.runs,
                self.outbox,
                self.drop_runs,
                self.meta,
            )
        )

    def write(
        self,
        dataset: str,
        record_id: str,
        fields: Mapping[str, Any],
        unset: Sequence[str] = (),
        if_version: int | None = None,
    ) -> None:
        """Queue a field-level write of a server record in the outbox."""
        self.outbox.append(Upsert(record_id, dict(fields), list(unset), if_version, dataset))
