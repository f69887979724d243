"""What a finished run writes: its `agent_runs` record and the rollup on its trigger (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anyrtd.rows import RunRow

STATUS_OF_RUN = {"ok": "ok", "FAILED": "error", "incomplete": "error", "interrupted": "interrupted"}
"""The trigger's `lastStatus` after a run ending with each run `status` (docs/programs.md)."""

BREAKER_STATUSES = frozenset({"FAILED", "incomplete"})
"""Run statuses that count toward the circuit breaker; `ok` resets it, `interrupted` is neither."""

AUTO_DISABLED = "auto_disabled"


def run_record(row: RunRow) -> dict[str, Any]:
    """Return the `agent_runs` record of a run: the seeds' fields, `scheduledAt` and `fuel`."""
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
        "scheduledAt": row.scheduled_at,
    }


@dataclass(frozen=True, slots=True)
class RollupWrite:
    """The rollup fields to write after a run, and the breaker's count and verdict."""

    fields: dict[str, Any]
    failures: int
    run_count: int
    tripped: bool


def rollup(row: RunRow, *, failures: int, run_count: int, limit: int, armed: bool) -> RollupWrite:
    """Return the rollup after `row` ended, given the breaker count and run count before it.

    The breaker trips when the count reaches `limit` on a trigger that is still `armed`
    (enabled on this device); a trigger the device no longer holds never trips here.
    """
    if row.status == "ok":
        failures = 0
    elif row.status in BREAKER_STATUSES:
        failures += 1
    run_count += 1
    fields: dict[str, Any] = {
        "lastRunAt": row.started_at,
        "lastStatus": STATUS_OF_RUN[row.status],
        "lastDurationMs": row.duration_ms,
        "lastFuel": row.result.get("fuel"),
        "lastCostUsd": row.result.get("costUsd"),
        "runCount": run_count,
        "consecutiveFailures": failures,
        "lastRunRef": row.run_id,
    }
    tripped = armed and limit > 0 and failures >= limit
    if tripped:
        fields["enabled"] = False
        fields["lastStatus"] = AUTO_DISABLED
    return RollupWrite(fields, failures, run_count, tripped)
