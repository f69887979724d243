"""The JSON shapes of the control API, built from registry entries, records and run rows.

Pure: `now` is passed in. The seeds' keys (`id, name, kind, owner, enabled, lastRunAt,
lastStatus, consecutiveFailures, limits`) come first; the rest are anyrtd's additions.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from anyrtd import agenda as agendas
from anyrtd.chain import RunFilter, describe
from anyrtd.clock import Slice
from anyrtd.metrics import Histogram, Stats
from anyrtd.missed import Missed, Occurrence
from anyrtd.model import Malformed, TriggerDef, chain_of, marker_reason
from anyrtd.port import MissedFacts
from anyrtd.registry import Entry
from anyrtd.rows import RunRow
from anyrtd.runs import run_record
from anyrtd.schedule import preview
from anyrtd.schedule.zones import local_text
from anyrtd.standing import STANDING_BY_ID, definition
from anyrtd.vocab import (
    ENDED_STATUSES,
    Kind,
    RollupField,
    RunStatus,
    Severity,
    TriggerState,
    Verdict,
)
from anyrtd.why import Answer, Here, Shown, explain, list_facts

NEXT_FIRES = 5


def trigger_shown(
    trigger_id: str,
    entry: Entry | None,
    parsed: TriggerDef | Malformed | None,
    peer_id: str | None,
    here: Here,
    now: float,
) -> Shown:
    """Return the state a trigger shows on this device: the one `why` gives it (its answer's
    `shown`), from the facts a list has at hand."""
    facts = list_facts(
        trigger_id, entry, parsed, peer_id, here, now, standing=trigger_id in STANDING_BY_ID
    )
    return explain(facts).shown


def trigger_view(
    trigger_id: str,
    entry: Entry | None,
    parsed: TriggerDef | Malformed | None,
    raw: Mapping[str, Any] | None,
    peer_id: str | None,
    now: float,
    *,
    detail: bool = False,
    missed: Missed | None = None,
    run_refused: str | None = None,
    here: Here | None = None,
) -> dict[str, Any]:
    """Return the control API's view of one trigger (a registry entry or a known record);
    `run_refused`: why a run by hand of it could only fail here; `here`: what this device
    is, as the trigger's state reads it."""
    defn = _shown(trigger_id, entry, parsed, raw)
    if defn is None:
        return _malformed_view(trigger_id, parsed, raw)
    look = trigger_shown(trigger_id, entry, parsed, peer_id, here or Here(), now)
    rollup = defn.rollup
    row = entry.row if entry is not None else None
    next_fire = row.next_fire if row is not None else None
    view: dict[str, Any] = {
        "id": trigger_id,
        "name": defn.name,
        "kind": defn.kind,
        "owner": defn.owner,
        "enabled": row.enabled if row is not None else defn.enabled,
        RollupField.LAST_RUN_AT: rollup.last_run_at,
        RollupField.LAST_STATUS: rollup.last_status,
        RollupField.CONSECUTIVE_FAILURES: (
            row.consecutive_failures if row is not None else rollup.consecutive_failures
        ),
        "limits": dict(defn.limits),
        "spec": dict(defn.spec),
        "program": defn.program,
        RollupField.RUN_COUNT: row.run_count if row is not None else rollup.run_count,
        "adopted": entry is not None,
        "state": look.state,
        "stateReason": look.reason,
        "severity": look.severity,
        "running": entry.running if entry is not None else 0,
        "runNowRefused": run_refused,
        "marker": row.marker if row is not None else None,
        "nextFire": next_fire,
        "nextFires": [] if next_fire is None else [next_fire],
        "version": defn.version,
        "missed": missed_summary(missed),
    }
    if (chain := chain_of(defn)) is not None:
        view["chain"] = chain_view(chain)
    if detail:
        view.update(
            args=dict(defn.args),
            maxConsecutiveFailures=defn.max_consecutive_failures,
            lastDurationMs=rollup.last_duration_ms,
            lastRunRef=rollup.last_run_ref,
            nextFires=next_fires(entry, now),
            markerReason=marker_reason(defn, now) if view["marker"] else None,
            armedAt=row.armed_at if row is not None else None,
            claimedAt=row.claimed_at if row is not None else None,
        )
    return view


def chain_view(f: RunFilter) -> dict[str, Any]:
    """Return what a chain answers (anyrtd/chain.py): the upstream triggers (None: every
    trigger's runs no chain started), the statuses (None: any), the device, in words."""
    return {
        "after": describe(f),
        "upstream": None if f.trigger_ids is None else sorted(f.trigger_ids),
        "statuses": None if f.statuses is None else sorted(f.statuses),
        "device": f.device,
        "lastFiredBy": None,
    }


def _shown(
    trigger_id: str,
    entry: Entry | None,
    parsed: TriggerDef | Malformed | None,
    raw: Mapping[str, Any] | None,
) -> TriggerDef | None:
    """Return the definition to show: the record's, but a standing built-in's is the code's
    (what runs, whatever its record says) over the record's `enabled` and rollup."""
    builtin = STANDING_BY_ID.get(trigger_id)
    if builtin is None:
        return parsed if isinstance(parsed, TriggerDef) else entry.defn if entry else None
    record = parsed.to_record() if isinstance(parsed, TriggerDef) else raw
    owner = entry.defn.owner if entry is not None else (record or {}).get("owner")
    return definition(builtin, owner if isinstance(owner, str) else "", record)


class ListCache:
    """The JSON of each trigger's list view, rebuilt only when its inputs change.

    `GET /triggers` on 10,000 entries would otherwise rebuild and re-encode every
    view on every request; between two requests only the entries that fired or were
    edited change. A view is a function of the entry (its row's state), the parsed
    record and this device's peer id, so that is the key. The key holds the objects
    themselves, compared by identity, so a recycled `id()` can never match.
    """

    def __init__(self) -> None:
        self._items: dict[str, tuple[tuple[Any, ...], bytes]] = {}

    async def render(
        self,
        ids: Iterable[str],
        entries: Mapping[str, Entry],
        parsed: Mapping[str, TriggerDef | Malformed],
        raw: Callable[[str], Mapping[str, Any] | None],
        peer_id: str | None,
        now: float,
        missed: Mapping[str, Missed] | None = None,
        refusal: Callable[[Entry], str | None] = lambda _entry: None,
        give_way: Callable[[], Awaitable[None]] | None = None,
        here: Here | None = None,
    ) -> bytes:
        """Return the JSON array of the list views of `ids`, in that order (`refusal`: why
        a run by hand of an entry could only fail here). Once a slice of the loop's time
        is spent, `give_way` is awaited before the next view: building 10,000 views of
        records not seen before held the loop (and a start) for 0.23 s."""
        fresh: dict[str, tuple[tuple[Any, ...], bytes]] = {}
        parts: list[bytes] = []
        within = Slice()
        here = here or Here()
        device = (here.verdict, here.may_claim, here.hold is None)
        for tid in ids:
            if give_way is not None and within.over():
                await give_way()
                within = Slice()
            entry = entries.get(tid)
            item = parsed.get(tid)
            key: tuple[Any, ...] = (item, entry, peer_id)
            gap = missed.get(tid) if missed else None
            refused = None
            if entry is not None:
                row = entry.row
                refused = refusal(entry)
                key += (
                    refused,
                    entry.defn,
                    entry.running,
                    row.enabled,
                    row.next_fire,
                    row.consecutive_failures,
                    row.run_count,
                    row.marker,
                    row.claimed_at,
                    row.consumed,
                )
            defn = entry.defn if entry is not None else item
            program = defn.program if isinstance(defn, TriggerDef) else None
            # what this device is, as the state reads it: compared by equality
            key += (gap, *device, program is None or here.installed(program))
            cached = self._items.get(tid)
            if cached is not None and _same(cached[0], key):
                data = cached[1]
            else:
                source = None if isinstance(item, TriggerDef) else raw(tid)
                view = trigger_view(
                    tid,
                    entry,
                    item,
                    source,
                    peer_id,
                    now,
                    missed=gap,
                    run_refused=refused,
                    here=here,
                )
                data = json.dumps(view, separators=(",", ":")).encode()
            fresh[tid] = (key, data)
            parts.append(data)
        self._items = fresh
        return b"[" + b",".join(parts) + b"]"


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Compare two cache keys: objects by identity, state values by equality."""
    if len(a) != len(b):
        return False
    return all(x is y for x, y in zip(a[:4], b[:4], strict=False)) and a[4:] == b[4:]


def next_fires(entry: Entry | None, now: float, n: int = NEXT_FIRES) -> list[float]:
    """Return the next `n` fire times of an armed entry, starting with the armed one."""
    if entry is None or entry.row.next_fire is None:
        return []
    first = entry.row.next_fire
    if entry.defn.kind != Kind.CRON:
        return [first]
    return [first, *preview(entry.defn, first, n - 1, anchor=entry.row.armed_at)]


def why_view(answer: Answer) -> dict[str, Any]:
    """Return the answer of `GET /triggers/:id/why`."""
    return {
        "id": answer.id,
        "state": answer.shown.state,
        "stateReason": answer.shown.reason,
        "severity": answer.shown.severity,
        "fires": answer.fires,
        "device": answer.device,
        "nextFire": answer.next_fires[0] if answer.next_fires else None,
        "nextFires": list(answer.next_fires),
        "reasons": [
            {
                "cause": r.cause,
                "text": r.text,
                "facts": dict(r.facts),
                "fix": r.fix,
                "blocking": r.blocking,
            }
            for r in answer.reasons
        ],
        "now": answer.now,
    }


MISSED_TIMES = 20
"""The newest missed occurrence times a trigger's list view carries (the timeline's marks)."""


def missed_summary(m: Missed | None) -> dict[str, Any] | None:
    """Return what a trigger's list view says of its missed occurrences (null: none)."""
    if m is None:
        return None
    last = m.last
    return {
        "count": m.count,
        "capped": m.capped,
        "since": m.since,
        "lastAt": last.at,
        "cause": last.cause,
        "text": last.text,
        "at": [o.at for o in m.occurrences[:MISSED_TIMES]],
    }


def occurrence_view(o: Occurrence) -> dict[str, Any]:
    """Return one missed occurrence as the API shows it."""
    return {"at": o.at, "cause": o.cause, "text": o.text, "fix": o.fix, "facts": dict(o.facts)}


def missed_view(facts: MissedFacts) -> dict[str, Any]:
    """Return the answer of `GET /triggers/:id/missed`."""
    m = facts.missed
    return {
        "id": facts.id,
        "count": m.count if m is not None else 0,
        "capped": m.capped if m is not None else False,
        "since": m.since if m is not None else None,
        "occurrences": [occurrence_view(o) for o in m.occurrences] if m is not None else [],
        "graceS": facts.grace_s,
        "lookbackS": facts.lookback_s,
        "now": facts.now,
    }


def agenda_occurrence(o: agendas.Occurrence) -> dict[str, Any]:
    """Return one occurrence of the agenda as the API shows it."""
    owner, risk = o.owner, o.risk
    return {
        "triggerId": o.trigger_id,
        "at": o.at,
        "local": local_text(o.at, o.tz) if o.at is not None else None,
        "tz": o.tz,
        "kind": o.kind,
        "owner": owner.peer,
        "device": owner.device,
        "deviceName": owner.name,
        "deviceState": owner.state,
        "deviceSince": owner.since,
        "atRisk": risk is not None,
        "cause": risk.cause if risk is not None else None,
        "reason": risk.text if risk is not None else None,
        "fix": risk.fix if risk is not None else None,
        "after": o.after,
    }


def agenda_view(a: agendas.Agenda, hours: float) -> dict[str, Any]:
    """Return the answer of `GET /agenda`."""
    return {
        "now": a.now,
        "until": a.until,
        "hours": hours,
        "occurrences": [agenda_occurrence(o) for o in a.occurrences],
        "listening": [agenda_occurrence(o) for o in a.listening],
        "atRisk": sum(1 for o in a.occurrences if o.at_risk)
        + sum(1 for o in a.listening if o.at_risk),
        "capped": list(a.capped),
        "truncated": a.truncated,
    }


def _malformed_view(
    trigger_id: str, parsed: TriggerDef | Malformed | None, raw: Mapping[str, Any] | None
) -> dict[str, Any]:
    raw = raw or {}

    def pick(key: str, kind: type | tuple[type, ...]) -> Any:
        value = raw.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    enabled = raw.get("enabled")
    return {
        "id": trigger_id,
        "name": pick("name", str) or trigger_id,
        "kind": pick("kind", str),
        "owner": pick("owner", str) or "",
        "enabled": enabled if isinstance(enabled, bool) else True,
        RollupField.LAST_RUN_AT: pick(RollupField.LAST_RUN_AT, (int, float)),
        RollupField.LAST_STATUS: pick(RollupField.LAST_STATUS, str),
        RollupField.CONSECUTIVE_FAILURES: pick(RollupField.CONSECUTIVE_FAILURES, int) or 0,
        "limits": pick("limits", dict) or {},
        "spec": raw.get("spec"),
        "program": pick("program", str),
        "args": pick("args", dict) or {},
        "adopted": False,
        "state": TriggerState.MALFORMED,
        "stateReason": None,
        "severity": Severity.BAD,
        "malformed": parsed.reason if isinstance(parsed, Malformed) else "record not readable",
        "running": 0,
        "runNowRefused": None,
        "marker": None,
        "nextFire": None,
        "nextFires": [],
        "version": pick("_v", int),
    }


def run_summary(row: RunRow) -> dict[str, Any]:
    """Return a run as its `agent_runs` record shows it, plus the error text."""
    return {**run_record(row), "error": row.error}


def run_detail(row: RunRow) -> dict[str, Any]:
    """Return a run with what it reported and printed."""
    return {
        **run_summary(row),
        "result": dict(row.result),
        "output": row.output,
        "outputDropped": row.output_dropped,
    }


def run_output(row: RunRow, start: int) -> dict[str, Any]:
    """Return a run's output from the character `start` on, and where the next read starts.

    A run's output only grows while it runs (the capture keeps a true prefix), so a reader
    that sends back `next` as its `from` gets each part once. `start` past the output of a
    run still running (its end is being written) reads nothing yet.
    """
    text = row.output[start:]
    return {
        "runId": row.run_id,
        "status": row.status,
        "running": row.status == RunStatus.RUNNING,
        "from": start,
        "next": max(start, len(row.output)),
        "text": text,
        "outputDropped": row.output_dropped,
    }


# --------------------------------------------------------------------------- metrics

NOT_ADOPTED = frozenset(
    {
        TriggerState.UNASSIGNED,
        TriggerState.PINNED_HERE,
        TriggerState.PINNED_ELSEWHERE,
        TriggerState.MALFORMED,
        TriggerState.UNKNOWN,
        TriggerState.DELETED,
    }
)
"""The states of a record this device holds no entry for: never among the metrics' entries."""
TRIGGER_STATES = tuple(s for s in TriggerState if s not in NOT_ADOPTED)
"""The states the metrics count registry entries in (each shown, zero or not)."""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _histogram(lines: list[str], name: str, help_text: str, hist: Histogram) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for le, count in hist.cumulative():
        lines.append(f'{name}_bucket{{le="{le}"}} {count}')
    lines += [f"{name}_sum {hist.total!r}", f"{name}_count {hist.n}"]


def metrics_text(
    *,
    states: Mapping[str, int],
    stats: Stats,
    outbox_depth: int,
    verdict: str,
    last_tick_age: float | None,
    peer_id: str | None,
    version: str,
    outbox_set_aside: int = 0,
    last_runs: Mapping[str, float | None] | None = None,
    missed_totals: Mapping[str, int] | None = None,
) -> str:
    """Return the Prometheus text exposition of the daemon's state.

    `last_runs` is every cron and `once` trigger of the space with its `lastRunAt` (None:
    never ran); each gets a missed-occurrences count, zero or not."""
    lines: list[str] = [
        "# HELP anyrtd_info The running anyrtd: version and peer id.",
        "# TYPE anyrtd_info gauge",
        f'anyrtd_info{{version="{_escape(version)}",peer="{_escape(peer_id or "")}"}} 1',
        "# HELP anyrtd_triggers Registry entries on this device by state.",
        "# TYPE anyrtd_triggers gauge",
    ]
    for state in sorted(set(TRIGGER_STATES) | set(states)):
        lines.append(f'anyrtd_triggers{{state="{_escape(state)}"}} {states.get(state, 0)}')
    lines += [
        "# HELP anyrtd_runs_total Runs finished since the daemon started, by status.",
        "# TYPE anyrtd_runs_total counter",
    ]
    finished = stats.runs_finished
    for status in sorted(set(ENDED_STATUSES) | set(finished)):
        lines.append(f'anyrtd_runs_total{{status="{_escape(status)}"}} {finished.get(status, 0)}')
    counters = (
        ("anyrtd_fires_total", "Runs started (scheduled and by hand).", stats.fires),
        (
            "anyrtd_overlap_skips_total",
            "Cron occurrences skipped because the previous run was still running.",
            stats.overlap_skips,
        ),
        (
            "anyrtd_missed_skips_total",
            "Cron occurrences skipped as missed: found too late (the daemon was stopped).",
            stats.missed_skips,
        ),
        ("anyrtd_ticks_total", "Reconcile ticks.", stats.ticks),
        (
            "anyrtd_malformed_skips_total",
            "Malformed records skipped (once per record version).",
            stats.malformed_skips,
        ),
    )
    for name, help_text, value in counters:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]
    _histogram(
        lines,
        "anyrtd_fire_lag_seconds",
        "Delay between an occurrence's due time and its start.",
        stats.fire_lag,
    )
    _histogram(
        lines,
        "anyrtd_tick_duration_seconds",
        "Duration of one reconcile tick.",
        stats.tick_duration,
    )
    lines += [
        "# HELP anyrtd_outbox_depth Writes waiting in the outbox for the server.",
        "# TYPE anyrtd_outbox_depth gauge",
        f"anyrtd_outbox_depth {outbox_depth}",
        "# HELP anyrtd_outbox_set_aside Writes the server can never take, kept in the mirror "
        "and not sent (`anyrtd doctor` lists them).",
        "# TYPE anyrtd_outbox_set_aside gauge",
        f"anyrtd_outbox_set_aside {outbox_set_aside}",
        "# HELP anyrtd_election_verdict This device's election verdict (1 for the one held).",
        "# TYPE anyrtd_election_verdict gauge",
    ]
    for v in Verdict:
        lines.append(f'anyrtd_election_verdict{{verdict="{v}"}} {1 if v == verdict else 0}')
    if last_tick_age is not None:
        lines += [
            "# HELP anyrtd_last_tick_age_seconds Seconds since the last reconcile tick.",
            "# TYPE anyrtd_last_tick_age_seconds gauge",
            f"anyrtd_last_tick_age_seconds {last_tick_age:.3f}",
        ]
    _trigger_lines(lines, last_runs or {}, missed_totals or {})
    return "\n".join(lines) + "\n"


def _trigger_lines(
    lines: list[str], last_runs: Mapping[str, float | None], totals: Mapping[str, int]
) -> None:
    """Add the per-trigger series: missed occurrences and the last run's time."""
    ids = sorted(set(last_runs) | set(totals))
    lines += [
        "# HELP anyrtd_missed_occurrences_total Occurrences of a trigger that did not run, "
        "counted since the daemon started (docs/notices.md).",
        "# TYPE anyrtd_missed_occurrences_total counter",
    ]
    for tid in ids:
        lines.append(
            f'anyrtd_missed_occurrences_total{{trigger="{_escape(tid)}"}} {totals.get(tid, 0)}'
        )
    lines += [
        "# HELP anyrtd_trigger_last_run_timestamp_seconds When a trigger last ran (its record's "
        "lastRunAt), whatever device ran it; a trigger that never ran has no series.",
        "# TYPE anyrtd_trigger_last_run_timestamp_seconds gauge",
    ]
    for tid in ids:
        at = last_runs.get(tid)
        if at is not None:
            lines.append(
                f'anyrtd_trigger_last_run_timestamp_seconds{{trigger="{_escape(tid)}"}} {at!r}'
            )
