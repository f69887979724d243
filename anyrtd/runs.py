"""What a finished run writes (pure): the fields a program may report, its `agent_runs`
record and the rollup on its trigger.

The `agent_runs` schema is the seeds' (Run records); docs/programs.md says what a program
may report and what happens to anything else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from anyrtd.rows import RunRow
from anyrtd.vocab import Kind, LastStatus, RollupField, RunStatus

STATUS_OF_RUN: Mapping[str, LastStatus] = {
    RunStatus.OK: LastStatus.OK,
    RunStatus.FAILED: LastStatus.ERROR,
    RunStatus.INCOMPLETE: LastStatus.ERROR,
    RunStatus.INTERRUPTED: LastStatus.INTERRUPTED,
}
"""The trigger's `lastStatus` after a run ending with each run `status`."""

BREAKER_STATUSES = frozenset({RunStatus.FAILED, RunStatus.INCOMPLETE})
"""Run statuses that count toward the circuit breaker; `ok` resets it, `interrupted` is neither."""

SERVER_UNAVAILABLE = "ServerUnavailable"
"""The `errorType` of a run that failed because the any server could not be reached
(connection refused, a timeout, a 5xx): it is `FAILED`, but the breaker neither counts nor
resets it, since the program is not at fault (docs/programs.md)."""
DAEMON_FAULT = "DaemonFault"
"""The `errorType` of a run the daemon could not start for a fault of its own (out of file
descriptors for the whole budget): `FAILED`, but not counted by the breaker either."""
NOT_THE_PROGRAMS = frozenset({SERVER_UNAVAILABLE, DAEMON_FAULT})
"""The `errorType`s of failures that are not the program's."""

# The agent_runs fields a program may report, well typed; everything else is dropped.
COUNT_KEYS = ("turns", "cells", "effects", "mutations")
TOKEN_KEYS = ("in", "out", "cacheRead", "cacheWrite")
TEXT_KEYS = ("model", "title")
NUMBER_KEYS = ("fuel", "costUsd")
TEXT_LIMIT = 500
"""The longest `model` or `title` kept, in characters; longer ones are cut."""


def normalize_result(raw: Any) -> tuple[dict[str, Any], list[str]]:
    """Return the well-typed run fields of a program's result, and a note per value dropped."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [f"result ignored: expected an object, got {type(raw).__name__}"]
    out: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in raw.items():
        if key in NUMBER_KEYS:
            if _is_number(value) and value >= 0:
                out[key] = value
                continue
        elif key in COUNT_KEYS:
            if _is_int(value) and value >= 0:
                out[key] = value
                continue
        elif key in TEXT_KEYS:
            if isinstance(value, str) and value:
                text, replaced = valid_text(value[:TEXT_LIMIT])
                if replaced:
                    notes.append(f"result key {key!r}: {REPLACED}")
                out[key] = text
                continue
        elif key == "tokens":
            if isinstance(value, Mapping):
                tokens = {k: v for k, v in value.items() if k in TOKEN_KEYS}
                if tokens and all(_is_int(v) and v >= 0 for v in tokens.values()):
                    out[key] = tokens
                    continue
        else:
            notes.append(f"result key {key!r} ignored: not a run field")
            continue
        notes.append(f"result key {key!r} ignored: bad value {value!r:.80}")
    return out, notes


REPLACED = "text that is not valid Unicode (a lone surrogate) was replaced with U+FFFD"
"""The note a run's output carries when text from its program had to be made valid."""


def valid_text(text: str) -> tuple[str, bool]:
    """Return `text` as valid Unicode, and whether anything had to be replaced.

    A lone surrogate (what JSON's `"\\ud800"` decodes to, or a string cut through an emoji)
    cannot be encoded as UTF-8, so no record holding it can be sent or stored; each becomes
    U+FFFD. A surrogate pair split into two code points is joined back into its character.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"), True
    return text, False


def one_line(text: str, fallback: str) -> str:
    """Return the first non-blank line of `text`, shortened to fit a run's `error`."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[0] if lines else fallback
    return line if len(line) <= TEXT_LIMIT else line[: TEXT_LIMIT - 1] + "…"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def duration_ms(started_at: float, ended_at: float) -> int:
    """Return a run's `durationMs`: `endedAt - startedAt` of its record, which carries both
    to the millisecond, so that the three fields always agree."""
    return max(0, round((round(ended_at, 3) - round(started_at, 3)) * 1000))


def run_record(row: RunRow) -> dict[str, Any]:
    """Return the `agent_runs` record of a run: the seeds' fields, `scheduledAt` and `fuel`,
    and for a chain's run `upstreamRunId` and `chainDepth`."""
    record = _run_fields(row)
    if row.upstream_run_id is not None:
        record["upstreamRunId"] = row.upstream_run_id
        record["chainDepth"] = row.chain_depth
    return record


def _run_fields(row: RunRow) -> dict[str, Any]:
    result = row.result
    tokens = result.get("tokens")
    return {
        "runId": row.run_id,
        "triggerId": row.trigger_id,
        "program": row.program,
        "device": row.device,
        "startedAt": round(row.started_at, 3),
        "endedAt": round(row.ended_at, 3) if row.ended_at is not None else None,
        "durationMs": row.duration_ms,
        "status": row.status,
        "errorType": row.error_type,
        "turns": result.get("turns", 0),
        "cells": result.get("cells", 0),
        "effects": result.get("effects", 0),
        "mutations": result.get("mutations", 0),
        "tokens": tokens
        if isinstance(tokens, dict)
        else {"in": 0, "out": 0, "cacheRead": 0, "cacheWrite": 0},
        "costUsd": result.get("costUsd"),
        "fuel": result.get("fuel"),
        "model": result.get("model"),
        "title": result.get("title"),
        # To the millisecond as `startedAt` is: rounded alike, a start after its due time
        # never reads as before it (an `every_s` occurrence falls anywhere in a millisecond).
        "scheduledAt": round(row.scheduled_at, 3) if row.scheduled_at is not None else None,
    }


def run_row(record: Mapping[str, Any]) -> RunRow | None:
    """Return the run an `agent_runs` record describes (any device's), or None when it lacks
    a run id or a start time. What a program reported comes back as the row's `result`; the
    error text and the output stay on the device that ran it."""
    run_id = record.get("runId", record.get("id"))
    started: Any = record.get("startedAt")
    if not isinstance(run_id, str) or not _is_number(started):
        return None

    def text(key: str) -> str | None:
        value = record.get(key)
        return value if isinstance(value, str) else None

    def number(key: str) -> float | None:
        value: Any = record.get(key)
        return float(value) if _is_number(value) else None

    duration = record.get("durationMs")
    result, _ = normalize_result(
        {k: v for k, v in record.items() if k in RESULT_KEYS and v is not None}
    )
    return RunRow(
        run_id=run_id,
        trigger_id=text("triggerId"),
        program=text("program") or "",
        device=text("device") or "",
        scheduled_at=number("scheduledAt"),
        started_at=float(started),
        status=text("status") or RunStatus.RUNNING,
        ended_at=number("endedAt"),
        duration_ms=duration if _is_int(duration) else None,
        error_type=text("errorType"),
        result=result,
        upstream_run_id=text("upstreamRunId"),
        chain_depth=_depth(record.get("chainDepth")),
    )


def _depth(value: Any) -> int:
    """Return a record's `chainDepth` (0 when absent or not a positive whole number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


RESULT_KEYS = frozenset((*COUNT_KEYS, *TEXT_KEYS, *NUMBER_KEYS, "tokens"))
"""The `agent_runs` fields that carry what a program reported."""


@dataclass(frozen=True, slots=True)
class RollupWrite:
    """The rollup fields to write after a run, and the breaker's count and verdict."""

    fields: dict[str, Any]
    failures: int
    run_count: int
    tripped: bool


def rollup(
    row: RunRow,
    *,
    failures: int,
    run_count: int,
    limit: int,
    armed: bool,
    kind: str | None = None,
    tripped_before: bool = False,
) -> RollupWrite:
    """Return the rollup after `row` ended, given the breaker count and run count before it.

    The breaker trips when the count reaches `limit` on a trigger that is still `armed`
    (enabled on this device); a trigger the device no longer holds never trips here.
    Its verdict is made once: a run that ends after the breaker `tripped_before` (one in
    flight beside the run that tripped it, whichever order they end in) writes its own
    fields but leaves the count and the `auto_disabled` status as the trip wrote them.
    A `once` takes `lastRunAt` as its consumed state (seeds), written when it fires, before
    its program starts (`firing`), so the rollup of a trigger of `kind` once writes every
    field but that one: a run by hand leaves a pending shot to fire at its `at` (on whichever
    device holds it, after any restart), and a run that ends after the record was armed
    again (a new `at`) does not consume the new shot. For the same reason a run by hand of
    a `once` (no `scheduledAt`) neither counts toward its breaker nor resets it: three
    failing runs by hand must not disable a shot still to fire (docs/control-api.md).
    """
    counted = not (kind == Kind.ONCE and row.scheduled_at is None)
    if tripped_before:
        counted = False  # the verdict stands until the trigger is enabled again
    if not counted:
        pass  # a run by hand of a once: its breaker guards the shot, which it does not take
    elif row.status == RunStatus.OK:
        failures = 0
    elif row.status in BREAKER_STATUSES and row.error_type not in NOT_THE_PROGRAMS:
        failures += 1
    run_count += 1
    fields: dict[str, Any] = {
        RollupField.LAST_RUN_AT: row.started_at,
        RollupField.LAST_STATUS: LastStatus.AUTO_DISABLED
        if tripped_before
        else STATUS_OF_RUN[row.status],
        RollupField.LAST_DURATION_MS: row.duration_ms,
        RollupField.LAST_FUEL: row.result.get("fuel"),
        RollupField.LAST_COST_USD: row.result.get("costUsd"),
        RollupField.RUN_COUNT: run_count,
        RollupField.CONSECUTIVE_FAILURES: failures,
        RollupField.LAST_RUN_REF: row.run_id,
    }
    if kind == Kind.ONCE:
        del fields[RollupField.LAST_RUN_AT]
    tripped = counted and armed and limit > 0 and failures >= limit
    if tripped:
        fields["enabled"] = False
        fields[RollupField.LAST_STATUS] = LastStatus.AUTO_DISABLED
    return RollupWrite(fields, failures, run_count, tripped)
