"""The OpenAPI 3.1 description of the control API (served at `GET /openapi.json`)."""

from __future__ import annotations

from typing import Any

from anyrtd.agenda import DEFAULT_HOURS, MAX_HOURS
from anyrtd.control.page import OPENAPI_PATHS
from anyrtd.vocab import (
    ENDED_STATUSES,
    SOURCE_HEADER,
    Cause,
    DeviceState,
    HistorySource,
    Kind,
    MissCause,
    OwnerState,
    RollupField,
    RunStatus,
    Severity,
    StateReason,
    TriggerState,
    Verdict,
)

_STATE: dict[str, Any] = {
    "type": "string",
    "enum": [*TriggerState],
    "description": "Where the trigger stands on this device: the same word in the list, "
    "the trigger's view and its why (decided once, from why's first blocking reason).",
}
_STATE_REASON: dict[str, Any] = {
    "type": ["string", "null"],
    "enum": [*StateReason, None],
    "description": "The state's reason in a word (`cannot_run (not_installed)`), or null.",
}
_SEVERITY: dict[str, Any] = {
    "type": "string",
    "enum": [*Severity],
    "description": "How much the state asks of its user (the status page's colour).",
}

RUN_STATUSES: list[str] = [RunStatus.RUNNING, *ENDED_STATUSES]
"""A run's `status` as the API shows it: `running` first, then the four outcomes."""

_NUM_OR_NULL: dict[str, Any] = {"type": ["number", "null"]}
_STR_OR_NULL: dict[str, Any] = {"type": ["string", "null"]}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    words = {
        400: "Bad input: the message says what to change.",
        401: "A bearer token is required (TCP listener with token_file).",
        403: "Refused: the Host is not loopback, or a cross-site write.",
        404: "No such trigger or run.",
        409: "The trigger is not in this device's registry (run), a run by hand of it "
        "could only fail here (run: its program runs only on an event, or is not installed), "
        "or the change is to a standing built-in's code-owned definition (PATCH).",
        415: "A body that is not JSON.",
        429: "Too many manual runs in flight on this daemon (16): wait for one to end.",
        502: "The any server refused the write.",
        503: "The any server is not reachable, or (run) the mirror cannot be written; "
        "nothing was written.",
    }
    return {str(s): _json(_ref("Error"), words[s]) for s in statuses}


_ID_PARAM = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "The trigger record id: at most 128 characters, no control characters "
    "(another is answered 400).",
    "schema": {"type": "string"},
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    },
    "Trigger": {
        "type": "object",
        "description": "A registry entry (or, with ?all=true, a record this daemon knows). "
        "The first nine keys are the seeds'; the rest are anyrtd's additions.",
        "required": [
            "id",
            "name",
            "kind",
            "owner",
            "enabled",
            RollupField.LAST_RUN_AT,
            RollupField.LAST_STATUS,
            RollupField.CONSECUTIVE_FAILURES,
            "limits",
        ],
        "properties": {
            "id": {"type": "string"},
            "name": {"type": "string"},
            "kind": {"type": ["string", "null"], "enum": [*Kind, None]},
            "owner": {"type": "string", "description": "The device pin; empty = unassigned."},
            "enabled": {"type": "boolean"},
            RollupField.LAST_RUN_AT: _NUM_OR_NULL,
            RollupField.LAST_STATUS: _STR_OR_NULL,
            RollupField.CONSECUTIVE_FAILURES: {"type": "integer"},
            "limits": {"type": "object"},
            "spec": {},
            "program": _STR_OR_NULL,
            "args": {"type": "object"},
            "maxConsecutiveFailures": {"type": "integer"},
            RollupField.RUN_COUNT: {"type": "integer"},
            RollupField.LAST_DURATION_MS: _NUM_OR_NULL,
            RollupField.LAST_RUN_REF: _STR_OR_NULL,
            "adopted": {"type": "boolean", "description": "In this device's registry."},
            "state": _STATE,
            "stateReason": _STATE_REASON,
            "severity": _SEVERITY,
            "running": {"type": "integer"},
            "runNowRefused": {
                "type": ["string", "null"],
                "description": "Why a run by hand could only fail on this device (its program "
                "runs only on an event, or is not installed here): `POST /triggers/{id}/run` "
                "answers 409 `cannot_run`. Null when it can run.",
            },
            "marker": _STR_OR_NULL,
            "markerReason": _STR_OR_NULL,
            "malformed": {"type": "string", "description": "Why the record is skipped."},
            "nextFire": _NUM_OR_NULL,
            "nextFires": {"type": "array", "items": {"type": "number"}},
            "armedAt": _NUM_OR_NULL,
            "claimedAt": _NUM_OR_NULL,
            "version": {"type": ["integer", "null"]},
            "missed": {
                "oneOf": [{"type": "null"}, _ref("MissedSummary")],
                "description": "Its missed occurrences at the missed watch's last pass "
                "(null: none; docs/notices.md).",
            },
            "chain": {
                **_ref("Chain"),
                "description": "Only on a chain (an event on agent_runs, docs/events.md).",
            },
        },
    },
    "Chain": {
        "type": "object",
        "required": ["after", "upstream", "statuses", "device", "lastFiredBy"],
        "properties": {
            "after": {"type": "string", "description": 'In words: "after each ok run of X".'},
            "upstream": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "description": "The triggers whose runs fire it; null: every trigger's runs "
                "that no chain started.",
            },
            "statuses": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "description": "The run statuses that fire it; null: any.",
            },
            "device": _STR_OR_NULL,
            "lastFiredBy": {
                **_STR_OR_NULL,
                "description": "The upstream run its last run answered (GET /triggers/{id}).",
            },
        },
    },
    "MissedSummary": {
        "type": "object",
        "required": ["count", "capped", "since", "lastAt", "cause", "text", "at"],
        "properties": {
            "count": {"type": "integer"},
            "capped": {"type": "boolean", "description": "More may have been missed."},
            "since": {"type": "number", "description": "Where the look-back started."},
            "lastAt": {"type": "number", "description": "The newest missed occurrence."},
            "cause": {"enum": list(MissCause)},
            "text": {"type": "string"},
            "at": {
                "type": "array",
                "items": {"type": "number"},
                "description": "The newest missed occurrences (at most 20).",
            },
        },
    },
    "AgendaOccurrence": {
        "type": "object",
        "required": [
            "triggerId",
            "at",
            "local",
            "tz",
            "kind",
            "owner",
            "device",
            "deviceName",
            "deviceState",
            "deviceSince",
            "atRisk",
            "cause",
            "reason",
            "fix",
            "after",
        ],
        "properties": {
            "triggerId": {"type": "string"},
            "at": {
                "type": ["number", "null"],
                "description": "Unix seconds; null for an event trigger (in `listening`).",
            },
            "local": {
                "type": ["string", "null"],
                "description": "`at` as the wall time of the schedule's zone.",
            },
            "tz": {
                "type": "string",
                "description": "The schedule zone: UTC unless a cron names one.",
            },
            "kind": {"enum": list(Kind)},
            "owner": {"type": "string", "description": "The record's owner (empty: unassigned)."},
            "device": {
                **_STR_OR_NULL,
                "description": "The device that fires it: the owner, or the active device.",
            },
            "deviceName": _STR_OR_NULL,
            "deviceState": {"enum": list(OwnerState)},
            "deviceSince": {
                **_NUM_OR_NULL,
                "description": "Since when a `not_running` device has recorded nothing.",
            },
            "atRisk": {
                "type": "boolean",
                "description": "It will be missed as things stand.",
            },
            "cause": {
                "enum": [*MissCause, None],
                "description": "The cause a miss would have (null: not at risk).",
            },
            "reason": {**_STR_OR_NULL, "description": "Why it is at risk."},
            "fix": {**_STR_OR_NULL, "description": "The command that helps, as `why` gives it."},
            "after": {
                **_STR_OR_NULL,
                "description": "The upstream trigger whose occurrence a chain follows.",
            },
        },
    },
    "Agenda": {
        "type": "object",
        "required": [
            "now",
            "until",
            "hours",
            "occurrences",
            "listening",
            "atRisk",
            "capped",
            "truncated",
        ],
        "properties": {
            "now": {"type": "number"},
            "until": {"type": "number"},
            "hours": {"type": "number"},
            "occurrences": {
                "type": "array",
                "description": "In time order (at most 10,000; then `truncated`).",
                "items": _ref("AgendaOccurrence"),
            },
            "listening": {
                "type": "array",
                "description": "Event triggers that follow no timed trigger: no times.",
                "items": _ref("AgendaOccurrence"),
            },
            "atRisk": {"type": "integer", "description": "How many are at risk."},
            "capped": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Triggers with more than 100 occurrences in the window.",
            },
            "truncated": {"type": "boolean"},
        },
    },
    "Missed": {
        "type": "object",
        "required": ["id", "count", "capped", "since", "occurrences", "graceS", "lookbackS", "now"],
        "properties": {
            "id": {"type": "string"},
            "count": {"type": "integer"},
            "capped": {"type": "boolean"},
            "since": _NUM_OR_NULL,
            "occurrences": {
                "type": "array",
                "description": "Newest first (at most 20; `count` has them all).",
                "items": {
                    "type": "object",
                    "required": ["at", "cause", "text", "fix", "facts"],
                    "properties": {
                        "at": {"type": "number"},
                        "cause": {"enum": list(MissCause)},
                        "text": {"type": "string"},
                        "fix": _STR_OR_NULL,
                        "facts": {"type": "object"},
                    },
                },
            },
            "graceS": {"type": "number"},
            "lookbackS": {"type": "number"},
            "now": {"type": "number"},
        },
    },
    "TriggerPatch": {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "properties": {
            "spec": {
                "type": "object",
                "description": 'Per kind: {"cron": "<expr>", "tz"?} or {"every_s": n}; '
                '{"at": <epoch s>}; {"dataset": "chat_messages", "objectId", "spaceId"?} or '
                '{"dataset": "agent_runs", "filter"?: {"triggerId"?, "status"?, "device"?}}. '
                "A chain that would close a loop is refused with 409 `chain_loop`.",
            },
            "enabled": {"type": "boolean"},
        },
    },
    "Run": {
        "type": "object",
        "description": "A run summary: the agent_runs record's fields plus scheduledAt and error.",
        "required": ["runId", "triggerId", "program", "device", "startedAt", "status"],
        "properties": {
            "runId": {"type": "string"},
            "triggerId": _STR_OR_NULL,
            "program": {"type": "string"},
            "device": {"type": "string"},
            "startedAt": {"type": "number"},
            "endedAt": _NUM_OR_NULL,
            "durationMs": {"type": ["integer", "null"]},
            "status": {"type": "string", "enum": RUN_STATUSES},
            "errorType": _STR_OR_NULL,
            "error": _STR_OR_NULL,
            "turns": {"type": "integer"},
            "cells": {"type": "integer"},
            "effects": {"type": "integer"},
            "mutations": {"type": "integer"},
            "tokens": {"type": "object"},
            "costUsd": _NUM_OR_NULL,
            "model": _STR_OR_NULL,
            "title": _STR_OR_NULL,
            "scheduledAt": _NUM_OR_NULL,
            "upstreamRunId": {
                "type": "string",
                "description": "Only on a chain's run: the upstream run it answers.",
            },
            "chainDepth": {
                "type": "integer",
                "description": "Only on a chain's run: how many chains in a row led to it.",
            },
        },
    },
    "RunDetail": {
        "allOf": [
            _ref("Run"),
            {
                "type": "object",
                "required": ["result", "output", "outputDropped"],
                "properties": {
                    "result": {"type": "object"},
                    "output": {"type": "string", "description": "Captured stdout and stderr."},
                    "outputDropped": {"type": "integer"},
                },
            },
        ]
    },
    "RunOutput": {
        "type": "object",
        "required": ["runId", "status", "running", "from", "next", "text", "outputDropped"],
        "properties": {
            "runId": {"type": "string"},
            "status": {"type": "string", "enum": RUN_STATUSES},
            "running": {"type": "boolean", "description": "Still running: its output grows."},
            "from": {"type": "integer", "description": "The character offset asked for."},
            "next": {"type": "integer", "description": "The from of the following read."},
            "text": {"type": "string", "description": "The output from `from` to `next`."},
            "outputDropped": {"type": "integer", "description": "Bytes past the cap."},
        },
    },
    "Why": {
        "type": "object",
        "required": ["id", "fires", "device", "nextFire", "nextFires", "reasons", "now"],
        "properties": {
            "id": {"type": "string"},
            "state": _STATE,
            "stateReason": _STATE_REASON,
            "severity": _SEVERITY,
            "fires": {"type": "boolean", "description": "Whether it fires on this device."},
            "device": {
                **_STR_OR_NULL,
                "description": "The device it fires on (this one when `fires`), or null.",
            },
            "nextFire": _NUM_OR_NULL,
            "nextFires": {"type": "array", "items": {"type": "number"}},
            "reasons": {
                "type": "array",
                "items": _ref("Reason"),
                "description": "Blocking reasons first, in the order to fix them; then notes.",
            },
            "now": {"type": "number"},
        },
    },
    "Reason": {
        "type": "object",
        "required": ["cause", "text", "facts", "fix", "blocking"],
        "properties": {
            "cause": {"enum": list(Cause)},
            "text": {"type": "string"},
            "facts": {
                "type": "object",
                "description": "The facts behind the reason; a device's state in the "
                f"registry (`ownerState`, `winnerState`) is one of {', '.join(DeviceState)}.",
            },
            "fix": {**_STR_OR_NULL, "description": "The command that changes it."},
            "blocking": {"type": "boolean", "description": "False for a note."},
        },
    },
    "RunStarted": {
        "type": "object",
        "required": ["runId", "triggerId", "status"],
        "properties": {
            "runId": {"type": "string"},
            "triggerId": {"type": "string"},
            "status": {"const": "running"},
        },
    },
    "Election": {
        "type": "object",
        "required": ["app", "enabled", "active", "peerId", "winner"],
        "properties": {
            "app": {"type": "string"},
            "enabled": {"type": "boolean", "description": "False when the election is off."},
            "active": {"type": "boolean"},
            "peerId": _STR_OR_NULL,
            "winner": _STR_OR_NULL,
            "verdict": {"type": "string", "enum": [*Verdict]},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "lastTickAt", "lastTickAgeS"],
        "properties": {
            "status": {"type": "string", "enum": ["ok", "degraded", "stale", "starting"]},
            "version": {"type": "string"},
            "now": {"type": "number"},
            "lastTickAt": _NUM_OR_NULL,
            "lastTickAgeS": _NUM_OR_NULL,
            "staleAfterS": {"type": "number"},
            "tickS": {"type": "number"},
            "peerId": _STR_OR_NULL,
            "stateDir": {
                **_STR_OR_NULL,
                "description": "The state directory the daemon uses: its mirror and lock.",
            },
            "verdict": {"type": "string"},
            "triggers": {"type": "integer"},
            "serverResolved": {"type": "boolean"},
            "lastError": _STR_OR_NULL,
            "reasons": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Why the status is degraded; empty otherwise.",
            },
        },
    },
}


def _runs_answer() -> dict[str, Any]:
    answer = _json({"type": "array", "items": _ref("Run")}, "Newest first.")
    answer["headers"] = {
        SOURCE_HEADER: {
            "description": "Where the runs were read: the server's agent_runs, or this "
            "device's mirror (the server away, or no trigger asked for).",
            "schema": {"type": "string", "enum": [s.value for s in HistorySource]},
        }
    }
    return answer


def _trigger_op(summary: str, *, errors: tuple[int, ...] = (400, 404)) -> dict[str, Any]:
    return {
        "summary": summary,
        "parameters": [_ID_PARAM],
        "responses": {"200": _json(_ref("Trigger"), "The trigger."), **_errors(*errors)},
    }


def _paths() -> dict[str, Any]:
    write_errors = (400, 403, 404, 415, 502, 503)
    return {
        "/triggers": {
            "get": {
                "summary": "Every registry entry on this device.",
                "parameters": [
                    {
                        "name": "all",
                        "in": "query",
                        "required": False,
                        "description": "Also list records this device does not hold "
                        "(pinned elsewhere, unassigned, malformed).",
                        "schema": {"type": "boolean"},
                    }
                ],
                "responses": {
                    "200": _json({"type": "array", "items": _ref("Trigger")}, "The entries."),
                    **_errors(400),
                },
            }
        },
        "/triggers/{id}": {
            "get": _trigger_op("One trigger, with its next fire times."),
            "patch": {
                **_trigger_op(
                    "Change spec and/or enabled; a new spec re-arms forward. Writes through.",
                    errors=(*write_errors, 409),
                ),
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("TriggerPatch")}},
                },
            },
        },
        "/triggers/{id}/runs": {
            "get": {
                "summary": "The 20 newest run summaries of a trigger, on every device (the "
                "server's agent_runs; this device's mirror when the server is away).",
                "parameters": [_ID_PARAM],
                "responses": {
                    "200": _runs_answer(),
                    **_errors(400, 404),
                },
            }
        },
        "/triggers/{id}/why": {
            "get": {
                "summary": "Will it fire on this device; if not, every reason and its fix.",
                "description": "Answers for any id: adopted, pinned elsewhere, malformed, "
                "deleted or unknown (an unknown id answers 200 with the reason `unknown`).",
                "parameters": [_ID_PARAM],
                "responses": {"200": _json(_ref("Why"), "The answer."), **_errors(400)},
            }
        },
        "/triggers/{id}/missed": {
            "get": {
                "summary": "The occurrences it missed, newest first, each with its cause.",
                "description": "Any device answers for any cron or once trigger of the space, "
                "wherever it is pinned (docs/notices.md).",
                "parameters": [_ID_PARAM],
                "responses": {"200": _json(_ref("Missed"), "The answer."), **_errors(404)},
            }
        },
        "/triggers/{id}/enable": {
            "post": _trigger_op(
                "Enable and reset the breaker. Writes through.", errors=write_errors
            )
        },
        "/triggers/{id}/disable": {
            "post": _trigger_op("Disable. Writes through.", errors=write_errors)
        },
        "/triggers/{id}/run": {
            "post": {
                "summary": "Run now, outside the schedule (a manual run, scheduledAt null).",
                "parameters": [_ID_PARAM],
                "responses": {
                    "202": _json(_ref("RunStarted"), "The run started."),
                    **_errors(400, 403, 404, 409, 415, 429, 503),
                },
            }
        },
        "/agenda": {
            "get": {
                "summary": "Every enabled trigger of the space: its next occurrences, its "
                "device's state, and whether each is at risk of being missed.",
                "description": "From the records: every device's triggers, not only this "
                'registry\'s (docs/cli.md, "agenda").',
                "parameters": [
                    {
                        "name": "hours",
                        "in": "query",
                        "schema": {
                            "type": "number",
                            "exclusiveMinimum": 0,
                            "maximum": MAX_HOURS,
                            "default": DEFAULT_HOURS,
                        },
                    },
                    {
                        "name": "device",
                        "in": "query",
                        "description": "Only this device's (a peer id or a device name).",
                        "schema": {"type": "string", "maxLength": 256},
                    },
                ],
                "responses": {"200": _json(_ref("Agenda"), "The agenda."), **_errors(400)},
            }
        },
        "/runs": {
            "get": {
                "summary": "The newest runs on this device; with trigger, that trigger's on "
                "every device, as /triggers/{id}/runs.",
                "parameters": [
                    {"name": "trigger", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "status",
                        "in": "query",
                        "schema": {"type": "string", "enum": RUN_STATUSES},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50},
                    },
                ],
                "responses": {
                    "200": _runs_answer(),
                    **_errors(400),
                },
            }
        },
        "/runs/{runId}": {
            "get": {
                "summary": "One run, with its result and captured output.",
                "parameters": [
                    {"name": "runId", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {"200": _json(_ref("RunDetail"), "The run."), **_errors(404)},
            }
        },
        "/runs/{runId}/output": {
            "get": {
                "summary": "A run's captured output from a character offset on; while the run "
                "runs, what it has written so far (send the answer's next as from to follow).",
                "parameters": [
                    {"name": "runId", "in": "path", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "from",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 999999999},
                    },
                ],
                "responses": {
                    "200": _json(_ref("RunOutput"), "The output from `from` on."),
                    **_errors(400, 404),
                },
            }
        },
        "/election": {
            "get": {
                "summary": "This device's election verdict.",
                "responses": {"200": _json(_ref("Election"), "The verdict.")},
            }
        },
        "/healthz": {
            "get": {
                "summary": "Liveness and the age of the last tick.",
                "responses": {
                    "200": _json(_ref("Health"), "Ticking (ok, or degraded: see reasons)."),
                    "503": _json(_ref("Health"), "Not ticking (stalled, or starting)."),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus text: triggers by state, runs by status, fire lag, tick "
                "duration, outbox depth, election verdict.",
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format 0.0.4.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document.",
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1.")},
            }
        },
        **OPENAPI_PATHS,
    }


def openapi_document(version: str) -> dict[str, Any]:
    """Return the OpenAPI document of the control API."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "anyrtd control API",
            "version": version,
            "description": "Monitor and steer the triggers this device holds. Mutating routes "
            "write through to the trigger record. Loopback only; see docs/control-api.md.",
        },
        "paths": _paths(),
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
