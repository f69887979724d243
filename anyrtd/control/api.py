"""The control API: the seeds' trigger routes plus runs, election, health, metrics and OpenAPI.

`make_app(port)` builds the aiohttp application on the daemon's port (`anyrtd.port.Port`);
`anyrtd.control.server` serves it inside the daemon's loop. Reads ask the port; writes go
through to the trigger record on the server first (`Port.write_through`), so the next
reconcile cannot revert them.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web

from anyrtd import __version__
from anyrtd.agenda import parse_hours
from anyrtd.client import ServerError, ServerUnavailable
from anyrtd.clock import Slice
from anyrtd.control.gate import ConnectionGate, Pacer, gate_metrics
from anyrtd.control.guard import (
    GUARD,
    MAX_BODY,
    Guard,
    error_response,
    errors_middleware,
    guard_middleware,
)
from anyrtd.control.openapi import openapi_document
from anyrtd.control.page import add_routes as add_page_routes
from anyrtd.control.views import (
    ListCache,
    agenda_view,
    metrics_text,
    missed_view,
    run_detail,
    run_output,
    run_summary,
    trigger_shown,
    trigger_view,
    why_view,
)
from anyrtd.history import RunHistory
from anyrtd.model import (
    TriggerDef,
    chain_loop,
    chains_among,
    id_problem,
    parse_record,
    spec_error,
)
from anyrtd.port import CannotRun, NotDurable, Port, TooManyRuns, TriggerFacts
from anyrtd.standing import code_owned
from anyrtd.vocab import (
    SOURCE_HEADER,
    HistorySource,
    Kind,
    LastStatus,
    Marker,
    RollupField,
    RunStatus,
)

PORT = web.AppKey("port", Port)
LIST_CACHE = web.AppKey("list_cache", ListCache)
GATE = web.AppKey("gate", ConnectionGate)

RUN_STATUSES = tuple(RunStatus)
TRIGGER_RUNS = 20
DEFAULT_RUNS_LIMIT = 50
MAX_RUNS_LIMIT = 1000
MAX_OUTPUT_OFFSET = 999_999_999
"""The largest `from` of GET /runs/:runId/output (nine digits: past any output's cap)."""
PATCHABLE = ("spec", "enabled")


class BadRequest(Exception):
    """The request cannot be served as sent; the message says what to change."""

    def __init__(self, message: str, status: int = 400, code: str = "bad_request") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def make_app(
    port: Port,
    guard: Guard | None = None,
    *,
    gate: ConnectionGate | None = None,
    pacer: Pacer | None = None,
) -> web.Application:
    """Build the control API application on `port` (the daemon's, or a fake of it).

    `gate` is the connection gate the app is served behind, if any; `pacer` spreads the
    requests' work over the loop's turns (a fresh one when not given).
    """
    pacer = pacer or Pacer()
    app = web.Application(
        middlewares=[
            *([gate.track] if gate is not None else []),
            errors_middleware,
            guard_middleware,
            pacer.middleware,
            _bad_request_middleware,
        ],
        client_max_size=MAX_BODY,
    )
    app[PORT] = port
    if gate is not None:
        app[GATE] = gate
    app[GUARD] = guard or Guard()
    app[LIST_CACHE] = ListCache()
    app.router.add_get("/triggers", list_triggers)
    app.router.add_get("/triggers/{id}", get_trigger)
    app.router.add_patch("/triggers/{id}", patch_trigger)
    app.router.add_get("/triggers/{id}/runs", trigger_runs)
    app.router.add_get("/triggers/{id}/why", trigger_why)
    app.router.add_get("/triggers/{id}/missed", trigger_missed)
    app.router.add_post("/triggers/{id}/enable", enable_trigger)
    app.router.add_post("/triggers/{id}/disable", disable_trigger)
    app.router.add_post("/triggers/{id}/run", run_trigger)
    app.router.add_get("/agenda", agenda)
    app.router.add_get("/runs", list_runs)
    app.router.add_get("/runs/{run_id}", get_run)
    app.router.add_get("/runs/{run_id}/output", get_run_output)
    app.router.add_get("/election", election)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    add_page_routes(app)
    return app


@web.middleware
async def _bad_request_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
    except BadRequest as exc:
        return error_response(exc.status, exc.code, str(exc))
    except ServerUnavailable as exc:
        return error_response(
            503,
            "server_unavailable",
            f"the any server is not reachable, so nothing was written ({exc}); "
            "start it or check `server` in the config, then retry",
        )
    except ServerError as exc:
        if exc.code == "tombstoned":
            return error_response(
                404, "not_found", f"trigger {request.match_info.get('id')!r} was deleted"
            )
        return error_response(
            502, "server_refused", f"the any server refused the write: {exc.message}"
        )
    return response


# --------------------------------------------------------------------------- helpers


def _port(request: web.Request) -> Port:
    return request.app[PORT]


def _view(facts: TriggerFacts, *, detail: bool) -> dict[str, Any]:
    return trigger_view(
        facts.id,
        facts.entry,
        facts.parsed,
        facts.raw,
        facts.peer_id,
        facts.now,
        detail=detail,
        run_refused=facts.run_refused,
        here=facts.here,
    )


def _trigger_id(request: web.Request) -> str:
    """Return the path's trigger id; refuse one no record can have (400), before a look-up."""
    trigger_id = request.match_info["id"]
    problem = id_problem(trigger_id)
    if problem is not None:
        raise BadRequest(f"trigger id refused, nothing was read or written: {problem}")
    return trigger_id


def _known(request: web.Request) -> tuple[Port, TriggerFacts]:
    port = _port(request)
    trigger_id = _trigger_id(request)
    facts = port.trigger(trigger_id)
    if facts is None:
        raise BadRequest(
            f"no trigger {trigger_id!r} among this daemon's records: "
            "`anyrtd triggers list --all` shows the ones it knows",
            status=404,
            code="not_found",
        )
    return port, facts


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name)
    if value is None:
        return False
    text = value.strip().lower()
    if text in ("", "1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise BadRequest(f"query parameter {name}={value!r}: use true or false")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _DuplicateKey(ValueError):
    """A JSON object that names one key twice: which value was meant cannot be known."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _DuplicateKey(key)
        found[key] = value
    return found


async def _json_body(request: web.Request) -> Any:
    body = await request.read()
    if not body.strip():
        raise BadRequest('send a JSON object, e.g. {"enabled": false}')
    try:
        return json.loads(
            body.decode("utf-8"),
            parse_float=_finite_float,
            parse_constant=_refuse_constant,
            object_pairs_hook=_unique_keys,
        )
    except _DuplicateKey as exc:
        raise BadRequest(
            f"the body names the key {json.dumps(str(exc))[:80]} twice, so which value was "
            "meant is unclear; nothing was written: send each key once"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the body is not valid JSON: {str(exc)[:200]}") from None


def _refuse_loop(
    port: Port, facts: TriggerFacts, fields: Mapping[str, Any], unset: Iterable[str]
) -> None:
    """Refuse a write that would make this trigger a chain in a loop (anyrtd/chain.py)."""
    before = facts.parsed.to_record() if isinstance(facts.parsed, TriggerDef) else facts.raw
    merged = {**(before or {}), **fields, "id": facts.id}
    for key in unset:
        merged.pop(key, None)
    after = parse_record(merged)
    if not (isinstance(after, TriggerDef) and after.kind == Kind.EVENT and after.enabled):
        return  # only an enabled chain can close a loop: nothing else pays for the check
    problem = chain_loop(chains_among(port.triggers().parsed.values()), after, facts.id)
    if problem is not None:
        raise BadRequest(f"refused, nothing was written: {problem}", status=409, code="chain_loop")


async def _write(
    port: Port, trigger_id: str, fields: Mapping[str, Any], unset: Iterable[str] = ()
) -> dict[str, Any]:
    facts = port.trigger(trigger_id)
    if facts is not None:
        _refuse_loop(port, facts, fields, unset)
    await port.write_through(trigger_id, fields, unset)
    facts = port.trigger(trigger_id)
    if facts is None:
        raise BadRequest(f"trigger {trigger_id!r} was deleted", status=404, code="not_found")
    return _view(facts, detail=True)


def _enable_fields(facts: TriggerFacts) -> tuple[dict[str, Any], list[str]]:
    """Return the write that enables a trigger and resets its breaker."""
    parsed = facts.parsed
    if isinstance(parsed, TriggerDef):
        last_status = parsed.rollup.last_status
    else:
        last_status = (facts.raw or {}).get(RollupField.LAST_STATUS)
    fields: dict[str, Any] = {"enabled": True, RollupField.CONSECUTIVE_FAILURES: 0}
    if last_status == LastStatus.AUTO_DISABLED:
        # The breaker tripped on a failed run: the trip goes, that run's status stays.
        fields[RollupField.LAST_STATUS] = LastStatus.ERROR
    return fields, []


# --------------------------------------------------------------------------- triggers


async def list_triggers(request: web.Request) -> web.Response:
    """GET /triggers: every registry entry (with ?all=true, every record this daemon knows)."""
    port = _port(request)
    everything = _flag(request, "all")
    known = port.triggers()
    ids = set(known.entries)
    if everything:
        ids.update(known.parsed)
    body = await request.app[LIST_CACHE].render(
        sorted(ids),
        known.entries,
        known.parsed,
        known.raw,
        known.peer_id,
        known.now,
        missed=known.missed,
        refusal=known.refusal,
        give_way=port.give_way,
        here=known.here,
    )
    return web.Response(body=body, content_type="application/json")


async def get_trigger(request: web.Request) -> web.Response:
    """GET /triggers/:id: one trigger with its next fire times (a chain's, with the upstream
    run that fired its last run)."""
    port, facts = _known(request)
    view = _view(facts, detail=True)
    chain, ref = view.get("chain"), view.get(RollupField.LAST_RUN_REF)
    if chain is not None and isinstance(ref, str):
        row = await port.run(ref)
        if row is None:  # run on another device: its record says
            history = await port.trigger_runs(facts.id, limit=TRIGGER_RUNS)
            row = next((r for r in history.runs if r.run_id == ref), None)
        chain["lastFiredBy"] = row.upstream_run_id if row is not None else None
    return web.json_response(view)


async def trigger_runs(request: web.Request) -> web.Response:
    """GET /triggers/:id/runs: the 20 newest run summaries, from every device."""
    port, facts = _known(request)
    return _history(await port.trigger_runs(facts.id, limit=TRIGGER_RUNS))


def _history(history: RunHistory) -> web.Response:
    """Answer the runs, saying where they were read (the list keeps the seeds' shape)."""
    return web.json_response(
        [run_summary(r) for r in history.runs], headers={SOURCE_HEADER: history.source}
    )


async def trigger_why(request: web.Request) -> web.Response:
    """GET /triggers/:id/why: will it fire here; if not, every reason and its fix."""
    answer = await _port(request).why(_trigger_id(request))
    return web.json_response(why_view(answer))


async def trigger_missed(request: web.Request) -> web.Response:
    """GET /triggers/:id/missed: the occurrences it missed, newest first, each with its cause."""
    port, facts = _known(request)
    return web.json_response(missed_view(await port.missed(facts.id)))


async def patch_trigger(request: web.Request) -> web.Response:
    """PATCH /triggers/:id {spec?, enabled?}: write through; a new spec re-arms forward."""
    port, facts = _known(request)
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise BadRequest('the body must be a JSON object such as {"enabled": false}')
    unknown = sorted(set(body) - set(PATCHABLE))
    if unknown:
        raise BadRequest(
            f"cannot change {', '.join(unknown)} here: PATCH takes spec and enabled; "
            "use `anyrtd triggers edit` for the other fields"
        )
    if not body:
        raise BadRequest('nothing to change: send spec and/or enabled, e.g. {"enabled": false}')
    if owned := code_owned(facts.id, body):
        raise BadRequest(
            f"trigger {facts.id!r} is a standing built-in: its {', '.join(owned)} is anyrtd's "
            "own (docs/election.md), nothing was written; only enabled can change, e.g. "
            '{"enabled": false}',
            status=409,
            code="code_owned",
        )
    fields: dict[str, Any] = {}
    unset: list[str] = []
    parsed = facts.parsed
    if "spec" in body:
        kind = parsed.kind if isinstance(parsed, TriggerDef) else _raw_kind(facts)
        problem = spec_error(kind, body["spec"])
        if problem is not None:
            raise BadRequest(
                f"spec refused, nothing was written: {problem}", code=Marker.INVALID_SPEC
            )
        fields["spec"] = body["spec"]
        if kind == Kind.ONCE and isinstance(parsed, TriggerDef) and body["spec"] != parsed.spec:
            # A once takes lastRunAt as its consumed state: a new `at` re-arms the shot.
            unset.append(RollupField.LAST_RUN_AT)
            if parsed.rollup.last_run_at is not None and not parsed.enabled:
                # It fired and disabled itself: armed again means enabled again.
                body.setdefault("enabled", True)
    if "enabled" in body:
        enabled = body["enabled"]
        if not isinstance(enabled, bool):
            raise BadRequest(f"enabled must be true or false, not {json.dumps(enabled)[:40]}")
        if enabled:
            more, extra_unset = _enable_fields(facts)
            fields.update(more)
            unset += extra_unset
        else:
            fields["enabled"] = False
    return web.json_response(await _write(port, facts.id, fields, unset))


def _raw_kind(facts: TriggerFacts) -> str:
    kind = (facts.raw or {}).get("kind")
    return kind if isinstance(kind, str) else repr(kind)


async def enable_trigger(request: web.Request) -> web.Response:
    """POST /triggers/:id/enable: enable and reset the breaker (a `once` that already ran is
    refused: enabling it does not re-arm it; a new `at` does)."""
    port, facts = _known(request)
    parsed = facts.parsed
    if (
        isinstance(parsed, TriggerDef)
        and parsed.kind == Kind.ONCE
        and parsed.rollup.last_run_at is not None
    ):
        raise BadRequest(
            f"trigger {facts.id!r} is a once that already ran: enabling it does not run it "
            f"again; to run it again at a new time, `anyrtd triggers edit {facts.id} --at TIME` "
            "(--at +10m: in ten minutes)",
            status=409,
            code="consumed",
        )
    fields, unset = _enable_fields(facts)
    return web.json_response(await _write(port, facts.id, fields, unset))


async def disable_trigger(request: web.Request) -> web.Response:
    """POST /triggers/:id/disable."""
    port, facts = _known(request)
    return web.json_response(await _write(port, facts.id, {"enabled": False}))


async def run_trigger(request: web.Request) -> web.Response:
    """POST /triggers/:id/run: run now, outside the schedule (a manual run)."""
    port, facts = _known(request)
    trigger_id, parsed = facts.id, facts.parsed
    if facts.entry is None:
        owner = parsed.owner if isinstance(parsed, TriggerDef) else None
        where = f"pinned to {owner}" if owner else "not held by any device yet"
        if parsed is not None and not isinstance(parsed, TriggerDef):
            where = "malformed"
        raise BadRequest(
            f"trigger {trigger_id!r} is {where}, not in this device's registry "
            f"(peer {facts.peer_id}): run it on its device, or pin it here with "
            f"`anyrtd triggers pin {trigger_id} {facts.peer_id}`",
            status=409,
            code="not_adopted",
        )
    try:
        run_id = await port.run_now(trigger_id)
    except CannotRun as exc:
        raise BadRequest(str(exc), status=409, code="cannot_run") from None
    except TooManyRuns as exc:
        raise BadRequest(str(exc), status=429, code="too_many_runs") from None
    except NotDurable as exc:
        raise BadRequest(str(exc), status=503, code="not_durable") from None
    if run_id is None:
        raise BadRequest(f"trigger {trigger_id!r} could not be started", status=409, code="busy")
    return web.json_response(
        {"runId": run_id, "triggerId": trigger_id, "status": RunStatus.RUNNING}, status=202
    )


# --------------------------------------------------------------------------- runs


async def list_runs(request: web.Request) -> web.Response:
    """GET /runs?trigger=&status=&limit=: the newest runs on this device; a trigger's from
    every device."""
    port = _port(request)
    trigger = request.query.get("trigger") or None
    problem = None if trigger is None else id_problem(trigger)
    if problem is not None:
        raise BadRequest(f"query parameter trigger refused: {problem}")
    status = request.query.get("status") or None
    if status is not None and status not in RUN_STATUSES:
        raise BadRequest(f"status {status!r} is not one of {', '.join(RUN_STATUSES)}")
    limit_text = request.query.get("limit")
    limit = DEFAULT_RUNS_LIMIT
    if limit_text is not None:
        digits = limit_text.strip()
        if not (digits.isascii() and digits.isdigit()) or not 1 <= int(digits) <= MAX_RUNS_LIMIT:
            raise BadRequest(
                f"limit {limit_text!r}: give a whole number from 1 to {MAX_RUNS_LIMIT}"
            )
        limit = int(limit_text)
    if trigger is not None:
        return _history(await port.trigger_runs(trigger, status=status, limit=limit))
    rows = await port.runs(status=status, limit=limit)
    return _history(RunHistory(rows, HistorySource.MIRROR))


async def get_run(request: web.Request) -> web.Response:
    """GET /runs/:runId: one run with its result and captured output."""
    run_id = request.match_info["run_id"]
    row = await _port(request).run(run_id)
    if row is None:
        raise BadRequest(
            f"no run {run_id!r} on this device: `anyrtd runs list` shows the recent ones",
            status=404,
            code="not_found",
        )
    return web.json_response(run_detail(row))


# --------------------------------------------------------------------------- the agenda

MAX_DEVICE_LENGTH = 256


async def agenda(request: web.Request) -> web.Response:
    """GET /agenda?hours=&device=: every listed trigger's occurrences in the next hours,
    in time order, each with its device's state and whether it is at risk."""
    try:
        hours = parse_hours(request.query.get("hours"))
    except ValueError as exc:
        raise BadRequest(f"query parameter {exc}") from None
    device = request.query.get("device") or None
    if device is not None and (
        len(device) > MAX_DEVICE_LENGTH or not device.isprintable() or device != device.strip()
    ):
        raise BadRequest(
            f"query parameter device: give a peer id or a device name (at most "
            f"{MAX_DEVICE_LENGTH} printable characters), not {device[:40]!r}"
        )
    port = _port(request)
    await port.give_way()  # one walk over every definition: after a start due soon
    answer = port.agenda(hours, device)
    return web.json_response(agenda_view(answer, hours))


async def get_run_output(request: web.Request) -> web.Response:
    """GET /runs/:runId/output?from=N: a run's output from the character N on (0 when left
    out), growing while the run runs; `next` is where the following read starts."""
    run_id = request.match_info["run_id"]
    raw = request.query.get("from", "0")
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise BadRequest(
            f"from must be a character offset 0-{MAX_OUTPUT_OFFSET}, as the last answer's "
            f"next gave it, not {raw[:40]!r}"
        )
    row = await _port(request).run(run_id)
    if row is None:
        raise BadRequest(
            f"no run {run_id!r} on this device: `anyrtd runs list` shows the recent ones",
            status=404,
            code="not_found",
        )
    start = int(raw)
    if start > len(row.output) and row.status != RunStatus.RUNNING:
        raise BadRequest(
            f"from {start} is past the end of run {run_id!r}'s output "
            f"({len(row.output)} characters): read it from 0"
        )
    return web.json_response(run_output(row, start))


# --------------------------------------------------------------------------- the rest


async def election(request: web.Request) -> web.Response:
    """GET /election: this device's verdict as the gate holds it."""
    return web.json_response(_port(request).election())


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: liveness and the age of the last tick (503 when ticks have stalled);
    `degraded` (still 200) with `reasons` when part of the job cannot be done."""
    health = _port(request).health()
    age = health.last_tick_age
    stale_after = max(3 * health.tick_s, 30.0)
    status = "starting" if age is None else "ok" if age <= stale_after else "stale"
    if status == "ok" and health.degraded:
        status = "degraded"  # doing its job in part: still 200, so a supervisor keeps it
    body = {
        "status": status,
        "version": __version__,
        "now": health.now,
        "lastTickAt": health.last_tick_at,
        "lastTickAgeS": None if age is None else round(age, 3),
        "staleAfterS": stale_after,
        "tickS": health.tick_s,
        "peerId": health.peer_id,
        "stateDir": health.state_dir,
        "verdict": health.verdict,
        "triggers": health.triggers,
        "serverResolved": health.server_resolved,
        "lastError": health.last_error,
        "reasons": list(health.degraded),
    }
    return web.json_response(body, status=200 if status in ("ok", "degraded") else 503)


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text."""
    port = _port(request)
    known = port.triggers()
    states: Counter[str] = Counter()
    last_runs = {
        tid: item.rollup.last_run_at
        for tid in known.parsed
        if isinstance(item := known.parsed.get(tid), TriggerDef)
        and item.kind in (Kind.CRON, Kind.ONCE)
    }
    within = Slice()
    for tid, entry in known.entries.items():
        if within.over():
            await port.give_way()
            within = Slice()
        item = known.parsed.get(tid)
        look = trigger_shown(tid, entry, item, known.peer_id, known.here, known.now)
        states[look.state] += 1
    facts = await port.metrics()
    text = metrics_text(
        states=states,
        stats=facts.stats,
        outbox_depth=facts.outbox_depth,
        outbox_set_aside=facts.outbox_set_aside,
        verdict=facts.verdict,
        last_tick_age=facts.last_tick_age,
        peer_id=facts.peer_id,
        version=__version__,
        last_runs=last_runs,
        missed_totals=known.missed_totals,
    )
    gate = request.app.get(GATE)
    if gate is not None:
        text += gate_metrics(gate)
    return web.Response(
        body=text.encode("utf-8"),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


async def openapi(request: web.Request) -> web.Response:
    """GET /openapi.json: this API described in OpenAPI 3.1."""
    return web.json_response(openapi_document(__version__))
