"""The trigger model: a record from `agent_triggers` parsed into a typed definition, or malformed.

Pure and clock-free, but for `spec_error`, which judges a write when it is made. Two kinds of
trouble are kept apart:

- **Malformed** (the daemon skips the record and logs the reason): the record's top-level
  fields have the wrong types, the kind is unknown, the program is missing.
- **A health marker** (the daemon adopts the record but it never fires, and `lastStatus` says
  why): the fields are well typed but the *content* of `spec` is unusable — a bad or
  never-matching cron expression, a bad zone, a once without a numeric `at`, an event without
  `dataset` and `objectId` (`invalid_spec`), a chain with an unusable filter
  (`invalid_spec`, anyrtd/chain.py), or an event on a dataset other than `chat_messages` and
  `agent_runs` (`unsupported_source`). A missing `spec` is content, so it is a marker; a
  `spec` that is not an object at all is a type error, so it is malformed.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from anyrtd.chain import RunFilter, find_cycle, show_cycle
from anyrtd.schedule import (
    CronSchedule,
    EventSchedule,
    InvalidSchedule,
    OnceSchedule,
    Schedule,
    compile_schedule,
)
from anyrtd.vocab import Kind, Marker, RollupField

__all__ = [
    "DEFAULT_MAX_CONSECUTIVE_FAILURES",
    "KINDS",
    "MAX_CONSECUTIVE_FAILURES",
    "MAX_ID_LENGTH",
    "MAX_PROGRAM_LENGTH",
    "RUNTIME_FIELDS",
    "STANDING_BUILTINS",
    "SUPPORTED_EVENT_DATASETS",
    "Malformed",
    "Rollup",
    "TriggerDef",
    "chain_loop",
    "chain_of",
    "chains_among",
    "fingerprint",
    "health_marker",
    "id_problem",
    "marker_reason",
    "once_at",
    "parse_record",
    "program_problem",
    "spec_error",
    "stand_in",
    "with_runtime",
    "with_version",
]

KINDS: frozenset[str] = frozenset(Kind)
STANDING_BUILTINS: frozenset[str] = frozenset(
    {"rollup", "extraction", "linkgen", "evolution", "decay", "reflection"}
)
SUPPORTED_EVENT_DATASETS: frozenset[str] = frozenset({"chat_messages"})
DEFAULT_MAX_CONSECUTIVE_FAILURES = 3
MAX_CONSECUTIVE_FAILURES = 1_000_000
"""The highest breaker threshold (`maxConsecutiveFailures`, `--max-failures`): a record with a
higher one is malformed, and the CLI and the control API refuse one before they write it."""
MAX_PROGRAM_LENGTH = 200
"""The longest program spec, in characters (`agent:remind@v1`, `mine:backup@v1`)."""
MAX_ID_LENGTH = 128
"""The longest trigger id, in characters: a record with a longer one is malformed, and the
control API and the CLI refuse one before they look it up."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_COUNTER_MAX = 2**53  # the rollup's counters: any count a JSON number holds exactly
_LIMIT_KEYS = ("fuelPerRun", "timeoutS", "maxCostPerRun")


@dataclass(frozen=True, slots=True)
class Rollup:
    """The fields the owning device writes on the record after each run."""

    last_run_at: float | None = None
    last_status: str | None = None
    last_duration_ms: float | None = None
    last_fuel: float | None = None
    last_cost_usd: float | None = None
    run_count: int = 0
    consecutive_failures: int = 0
    last_run_ref: str | None = None


@dataclass(frozen=True, slots=True)
class TriggerDef:
    """A well-typed trigger record; `schedule` is compiled once per definition."""

    id: str
    name: str
    kind: Kind
    spec: Mapping[str, Any]
    program: str
    args: Mapping[str, Any]
    owner: str
    enabled: bool
    limits: Mapping[str, Any]
    max_consecutive_failures: int
    rollup: Rollup
    version: int | None
    fingerprint: str
    schedule: Schedule

    def to_record(self) -> dict[str, Any]:
        """Return a record that parses back to this definition (fields it does not model drop)."""
        record: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "spec": dict(self.spec),
            "program": self.program,
            "args": dict(self.args),
            "owner": self.owner,
            "enabled": self.enabled,
            "maxConsecutiveFailures": self.max_consecutive_failures,
        }
        if self.limits:
            record["limits"] = dict(self.limits)
        if self.version is not None:
            record["_v"] = self.version
        r = self.rollup
        for key, value in (
            (RollupField.LAST_RUN_AT, r.last_run_at),
            (RollupField.LAST_STATUS, r.last_status),
            (RollupField.LAST_DURATION_MS, r.last_duration_ms),
            (RollupField.LAST_FUEL, r.last_fuel),
            (RollupField.LAST_COST_USD, r.last_cost_usd),
            (RollupField.LAST_RUN_REF, r.last_run_ref),
        ):
            if value is not None:
                record[key] = value
        if r.run_count:
            record[RollupField.RUN_COUNT] = r.run_count
        if r.consecutive_failures:
            record[RollupField.CONSECUTIVE_FAILURES] = r.consecutive_failures
        return record


@dataclass(frozen=True, slots=True)
class Malformed:
    """A record the daemon skips; `reason` is fit for a log line."""

    id: str
    reason: str
    version: int | None


class _Bad(Exception):
    """A malformed field; the message is the reason."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(record: Mapping[str, Any], key: str) -> float | None:
    v = record.get(key)
    if v is None:
        return None
    if not _is_number(v):
        raise _Bad(f"{key} must be a number, not {_show(v)}")
    try:
        f = float(v)
    except OverflowError:
        raise _Bad(f"{key} {v} is too large") from None
    if not math.isfinite(f):
        raise _Bad(f"{key} must be a finite number, not {v}")
    return f


def _count(record: Mapping[str, Any], key: str, default: int, minimum: int, maximum: int) -> int:
    """Read a whole number (JSON may send 3.0), from `minimum` to `maximum`."""
    v = record.get(key)
    if v is None:
        return default
    if not _is_number(v) or (isinstance(v, float) and not (math.isfinite(v) and v.is_integer())):
        raise _Bad(f"{key} must be a whole number, not {_show(v)}")
    n = int(v)
    if n < minimum:
        raise _Bad(f"{key} must be at least {minimum}, not {n}")
    if n > maximum:
        raise _Bad(f"{key} must be at most {maximum:,}, not {_show(v)}")
    return n


def _string(record: Mapping[str, Any], key: str) -> str | None:
    v = record.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise _Bad(f"{key} must be a string, not {_show(v)}")
    return v


def _object(record: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    v = record.get(key)
    if v is None:
        return None
    if type(v) is not dict and not isinstance(v, Mapping):  # dict first: ABC checks are slow
        raise _Bad(f"{key} must be an object, not {_show(v)}")
    if v and not set(map(type, v)) <= _STR:  # every key exactly a str, without a loop
        raise _Bad(f"{key} must have string keys")
    # A record is parsed once and then dropped: its decoded objects become the definition's
    # own rather than being copied (100,000 definitions would carry a copy each).
    return v if type(v) is dict else dict(v)


def _show(v: Any) -> str:
    """Describe a bad value briefly: its JSON type and a clipped repr."""
    kinds = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    kind = next((k for t, k in kinds.items() if type(v) is t), None)
    if kind is None:
        kind = (
            "an array"
            if isinstance(v, list | tuple)
            else "an object"
            if isinstance(v, Mapping)
            else type(v).__name__
        )
    text = repr(v)
    return f"{kind} ({text[:40]}{'...' if len(text) > 40 else ''})"


def fingerprint(
    kind: str,
    spec: Any,
    program: str,
    args: Mapping[str, Any],
    name: str,
    limits: Mapping[str, Any],
    max_consecutive_failures: int,
) -> str:
    """Return a stable hash of the definition core; a change in it means refresh the entry."""
    core = {
        "kind": kind,
        "spec": spec,
        "program": program,
        "args": args,
        "name": name,
        "limits": limits,
        "maxConsecutiveFailures": max_consecutive_failures,
    }
    text = "".join(_canonical(core, 0))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return dict(v)
    if isinstance(v, set | frozenset):
        return sorted(map(repr, v))
    return repr(v)


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_jsonable
)
"""The fingerprint's text: JSON with sorted keys, compact, not ASCII-escaped, `_jsonable` for
what JSON has no word for. Never change it: a new text would refresh every entry."""


def _encoder(options: json.JSONEncoder) -> Callable[[Any, int], Iterable[str]]:
    """Return `options`' one-shot encoder, made once: `JSONEncoder.encode` makes one per
    call (a fifth of a fingerprint's cost), and the C one when the interpreter has it."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return lambda value, _level: [options.encode(value)]
    encoder: Callable[[Any, int], Iterable[str]] = make(
        None,  # no check for cycles: a decoded record has none
        options.default,
        json.encoder.encode_basestring,  # not ASCII-escaped
        options.indent,
        options.key_separator,
        options.item_separator,
        options.sort_keys,
        options.skipkeys,
        options.allow_nan,
    )
    return encoder


_canonical = _encoder(_CANONICAL)


def parse_record(record: Mapping[str, Any]) -> TriggerDef | Malformed:
    """Parse a record as the server's query returns it (flat, with `id` and `_v`); never raises.

    The definition takes the record's nested objects (`spec`, `args`, `limits`) as its own:
    pass a record you will not change afterwards (a freshly decoded one).
    """
    try:
        return _parse(record)
    except _Bad as exc:
        return Malformed(_record_id(record), str(exc), _version(record))
    except Exception as exc:  # the last guard: no record may crash the reconcile
        return Malformed(_record_id(record), f"record could not be read: {exc!r}"[:200], None)


# Characters an id must not hold: they would act on a terminal or forge a log line. Control
# characters (C0, DEL, C1), line and paragraph separators, and the bidirectional controls
# that reorder what a terminal shows.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e") | frozenset(
    "\u2066\u2067\u2068\u2069"
)


def _unsafe(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in _BIDI_CONTROLS


def id_problem(rid: str) -> str | None:
    """Return why `rid` cannot be a trigger id (empty, too long, a control character), or None."""
    if not rid:
        return "the id is empty"
    if len(rid) > MAX_ID_LENGTH:
        return (
            f"the id is {len(rid):,} characters long, more than the limit of {MAX_ID_LENGTH} "
            f'(it starts "{rid[:20].encode("unicode_escape").decode("ascii")}…")'
        )
    if rid.isascii() and rid.isprintable():  # the common case, in C
        return None
    for i, ch in enumerate(rid):
        if _unsafe(ch):
            return (
                f"the id holds the control character U+{ord(ch):04X} at position {i + 1}; an "
                "id is printable text, like remind-standup"
            )
    return None


def program_problem(program: str) -> str | None:
    """Return why `program` cannot be a program spec (a space, a control character, too
    long), or None: a spec is a lookup key such as `agent:remind@v1`, one word."""
    shown = _show(program[:60] + ("…" if len(program) > 60 else ""))
    if len(program) > MAX_PROGRAM_LENGTH:
        return (
            f"program {shown} is {len(program):,} characters long; "
            f"a program spec has at most {MAX_PROGRAM_LENGTH}"
        )
    if any(ch.isspace() or _unsafe(ch) for ch in program):
        return (
            f"program {shown} is not a program spec: a spec is one word with no spaces or "
            'control characters, such as "agent:remind@v1" or "mine:backup@v1"'
        )
    return None


def _record_id(record: Any) -> str:
    try:
        rid = record.get("id") if isinstance(record, Mapping) else None
    except Exception:
        return ""
    return rid if isinstance(rid, str) else ""


def _version(record: Any) -> int | None:
    try:
        v = record.get("_v") if isinstance(record, Mapping) else None
    except Exception:
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _parse(record: Mapping[str, Any]) -> TriggerDef:
    if not isinstance(record, Mapping):
        raise _Bad(f"record must be an object, not {_show(record)}")
    rid = record.get("id")
    if not isinstance(rid, str) or not rid:
        raise _Bad(f"record id must be a non-empty string, not {_show(rid)}")
    bad_id = id_problem(rid)
    if bad_id is not None:
        raise _Bad(f"record id refused: {bad_id}")
    if record.get("_deleted") is True:
        raise _Bad("record is deleted (a tombstone)")
    version = record.get("_v")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise _Bad(f"_v must be a whole number, not {_show(version)}")

    kind = record.get("kind")
    if kind is None:
        raise _Bad('kind is missing; set it to "cron", "once" or "event"')
    if not isinstance(kind, str) or kind not in KINDS:
        shown = f'"{kind}"' if isinstance(kind, str) else _show(kind)
        raise _Bad(f'kind {shown} is not one of "cron", "once", "event"')
    program = record.get("program")
    if program is None:
        raise _Bad('program is missing; name a program spec such as "agent:remind@v1"')
    if not isinstance(program, str) or not program.strip():
        raise _Bad(
            f'program must be a program spec such as "agent:remind@v1", not {_show(program)}'
        )
    bad_program = program_problem(program)
    if bad_program is not None:
        raise _Bad(bad_program)

    raw_spec = record.get("spec")
    if raw_spec is not None and type(raw_spec) is not dict and not isinstance(raw_spec, Mapping):
        raise _Bad(f'spec must be an object such as {{"cron": "0 8 * * *"}}, not {_show(raw_spec)}')
    spec = _object(record, "spec") or {}
    for key in ("cron", "tz", "dataset"):  # many definitions share these: keep one copy
        if type(spec.get(key)) is str:
            spec[key] = sys.intern(spec[key])
    name = _string(record, "name") or rid
    args = _object(record, "args") or {}
    owner = sys.intern(_string(record, "owner") or "")
    program = sys.intern(program)
    enabled = record.get("enabled", True)
    if enabled is None:
        enabled = True
    if not isinstance(enabled, bool):
        raise _Bad(f"enabled must be true or false, not {_show(enabled)}")
    limits = _object(record, "limits") or {}
    for key in _LIMIT_KEYS:
        value = limits.get(key)
        if value is not None and not _is_number(value):
            raise _Bad(f"limits.{key} must be a number, not {_show(value)}")
    max_failures = _count(
        record,
        "maxConsecutiveFailures",
        DEFAULT_MAX_CONSECUTIVE_FAILURES,
        minimum=1,
        maximum=MAX_CONSECUTIVE_FAILURES,
    )
    rollup = _rollup(record)
    return TriggerDef(
        id=rid,
        name=name,
        kind=_KIND_OF[kind],
        spec=_frozen(spec),
        program=program,
        args=_frozen(args),
        owner=owner,
        enabled=enabled,
        limits=_frozen(limits),
        max_consecutive_failures=max_failures,
        rollup=rollup,
        version=version,
        fingerprint=fingerprint(kind, spec, program, args, name, limits, max_failures),
        schedule=_schedule(kind, spec, raw_spec is None),
    )


_ROLLUP_KEYS = (
    RollupField.LAST_RUN_AT,
    RollupField.LAST_STATUS,
    RollupField.LAST_DURATION_MS,
    RollupField.LAST_FUEL,
    RollupField.LAST_COST_USD,
    RollupField.RUN_COUNT,
    RollupField.CONSECUTIVE_FAILURES,
    RollupField.LAST_RUN_REF,
)
_NO_ROLLUP = Rollup()


def _frozen(value: dict[str, Any]) -> Mapping[str, Any]:
    # Read-only by type (Mapping), not by a proxy object per mapping: memory counts here.
    return value if value else _EMPTY


def _rollup(record: Mapping[str, Any]) -> Rollup:
    if record.keys().isdisjoint(_ROLLUP_KEYS) or all(
        record.get(key) is None for key in _ROLLUP_KEYS
    ):
        return _NO_ROLLUP  # never run: one shared value, not one per record
    return Rollup(
        last_run_at=_finite(record, RollupField.LAST_RUN_AT),
        last_status=_string(record, RollupField.LAST_STATUS),
        last_duration_ms=_finite(record, RollupField.LAST_DURATION_MS),
        last_fuel=_finite(record, RollupField.LAST_FUEL),
        last_cost_usd=_finite(record, RollupField.LAST_COST_USD),
        run_count=_count(record, RollupField.RUN_COUNT, 0, minimum=0, maximum=_COUNTER_MAX),
        consecutive_failures=_count(
            record, RollupField.CONSECUTIVE_FAILURES, 0, minimum=0, maximum=_COUNTER_MAX
        ),
        last_run_ref=_string(record, RollupField.LAST_RUN_REF),
    )


RUNTIME_FIELDS: frozenset[str] = frozenset(_ROLLUP_KEYS) | {"enabled"}
"""The fields the daemon writes after a fire: none is in the fingerprint or the schedule."""
_RUNTIME_KEYS = RUNTIME_FIELDS


def with_runtime(
    defn: TriggerDef, fields: Mapping[str, Any], unset: Iterable[str] = ()
) -> TriggerDef | None:
    """Return `defn` with `fields` written over it and `unset` removed, without parsing the
    whole record again: the definition `parse_record` gives for that record. Return None
    when a field is not one the daemon writes after a fire, or a value would not parse;
    then parse the record."""
    gone = set(unset)
    if not (fields.keys() <= _RUNTIME_KEYS and gone <= _RUNTIME_KEYS):
        return None
    enabled = defn.enabled
    if "enabled" in fields or "enabled" in gone:
        value = None if "enabled" in gone else fields.get("enabled")
        if value is None:
            enabled = True
        elif isinstance(value, bool):
            enabled = value
        else:
            return None
    rollup = defn.rollup
    if not fields.keys().isdisjoint(_ROLLUP_KEYS) or not gone.isdisjoint(_ROLLUP_KEYS):
        r = rollup
        merged: dict[str, Any] = {
            RollupField.LAST_RUN_AT: r.last_run_at,
            RollupField.LAST_STATUS: r.last_status,
            RollupField.LAST_DURATION_MS: r.last_duration_ms,
            RollupField.LAST_FUEL: r.last_fuel,
            RollupField.LAST_COST_USD: r.last_cost_usd,
            RollupField.RUN_COUNT: r.run_count or None,
            RollupField.CONSECUTIVE_FAILURES: r.consecutive_failures or None,
            RollupField.LAST_RUN_REF: r.last_run_ref,
        }
        merged.update(fields)
        for key in gone:
            merged[key] = None
        try:
            rollup = _rollup(merged)
        except _Bad:
            return None
    # Built field by field: `dataclasses.replace` costs several times as much.
    return TriggerDef(
        id=defn.id,
        name=defn.name,
        kind=defn.kind,
        spec=defn.spec,
        program=defn.program,
        args=defn.args,
        owner=defn.owner,
        enabled=enabled,
        limits=defn.limits,
        max_consecutive_failures=defn.max_consecutive_failures,
        rollup=rollup,
        version=defn.version,
        fingerprint=defn.fingerprint,
        schedule=defn.schedule,
    )


def stand_in(rid: str, kind: str, fingerprint: str, reason: str) -> TriggerDef:
    """Return a disabled definition that can never fire, for an entry whose record no longer
    parses (or is gone) when its definition is first read: its reconcile evicts it."""
    return TriggerDef(
        id=rid,
        name=rid,
        kind=_KIND_OF.get(kind, Kind.CRON),
        spec=_EMPTY,
        program="",
        args=_EMPTY,
        owner="",
        enabled=False,
        limits=_EMPTY,
        max_consecutive_failures=DEFAULT_MAX_CONSECUTIVE_FAILURES,
        rollup=_NO_ROLLUP,
        version=None,
        fingerprint=fingerprint,
        schedule=InvalidSchedule(f"the record does not parse: {reason}"),
    )


def with_version(defn: TriggerDef, version: int | None) -> TriggerDef:
    """Return `defn` as the same record at `version` parses (nothing else changes)."""
    return TriggerDef(
        id=defn.id,
        name=defn.name,
        kind=defn.kind,
        spec=defn.spec,
        program=defn.program,
        args=defn.args,
        owner=defn.owner,
        enabled=defn.enabled,
        limits=defn.limits,
        max_consecutive_failures=defn.max_consecutive_failures,
        rollup=defn.rollup,
        version=version,
        fingerprint=defn.fingerprint,
        schedule=defn.schedule,
    )


_STR = frozenset({str})
_KIND_OF = {k.value: k for k in Kind}
"""The `Kind` of a valid kind's text: a look-up, where `Kind(text)` costs a microsecond."""

_EVERY: dict[float, Schedule] = {}
"""Compiled `{"every_s": n}` schedules by period. Immutable, so one serves every definition
with that period: a start-up from 100,000 records compiles each period once."""
_EVERY_MAX = 4096


def _schedule(kind: str, spec: Mapping[str, Any], missing: bool) -> Schedule:
    if not missing and kind == "cron" and len(spec) == 1:
        every = spec.get("every_s")
        if type(every) is int or type(every) is float:
            known = _EVERY.get(every)
            if known is None:
                known = compile_schedule(kind, spec)
                if len(_EVERY) < _EVERY_MAX:
                    _EVERY[every] = known
            return known
    if missing:
        example = {
            "cron": '{"cron": "0 8 * * *"}',
            "once": '{"at": 1787000000}',
            "event": '{"dataset": "chat_messages", "objectId": "<chat id>"}',
        }[kind]
        return InvalidSchedule(f"spec is missing; a {kind} trigger needs one like {example}")
    return compile_schedule(kind, spec)


def _problem(schedule: Schedule, now: float | None) -> tuple[Marker, str] | None:
    """Return the marker and the reason of a schedule that can never fire, or None.

    The one check behind `health_marker`, `marker_reason` and `spec_error`: what the daemon
    marks is exactly what the control API and the CLI refuse.
    """
    if schedule.error is not None:
        return Marker.INVALID_SPEC, schedule.error
    if isinstance(schedule, EventSchedule):
        if schedule.dataset in SUPPORTED_EVENT_DATASETS or schedule.chain is not None:
            return None
        return Marker.UNSUPPORTED_SOURCE, _unsupported(schedule.dataset)
    if (
        now is not None
        and isinstance(schedule, CronSchedule)
        and schedule.expr.years is not None  # only a year field can run out of occurrences
        and schedule.next_after(now, now) is None
    ):
        return Marker.INVALID_SPEC, (
            f'cron "{schedule.expr.text}" has no occurrence after now: the last year of its '
            "year field has passed"
        )
    return None


def health_marker(defn: TriggerDef, now: float | None = None) -> Marker | None:
    """Return the marker of an enabled trigger that can never fire, or None.

    With `now`, a cron whose last occurrence has passed (a year field in the past) is marked
    too; without it only the spec itself is judged.
    """
    if not defn.enabled:
        return None
    problem = _problem(defn.schedule, now)
    return None if problem is None else problem[0]


def marker_reason(defn: TriggerDef, now: float | None = None) -> str | None:
    """Return a human sentence for the definition's health marker, or None."""
    if not defn.enabled:
        return None
    problem = _problem(defn.schedule, now)
    return None if problem is None else problem[1]


def _unsupported(dataset: str) -> str:
    shown = dataset if len(dataset) <= 80 else dataset[:79] + "…"
    return (
        f'event dataset "{shown}" is not supported; only "chat_messages" and "agent_runs" '
        "can fire a trigger"
    )


def spec_error(kind: str, spec: Any, now: float | None = None) -> str | None:
    """Return why `spec` is unusable for `kind` (for a 400 on PATCH), or None if it is fine.

    The same check as the daemon's `health_marker`: a spec is refused exactly when the
    daemon would mark it. `now` is when the spec is judged: a write is judged when it is
    made, so it defaults to the wall clock (the one clock read of this module).
    """
    if kind not in KINDS:
        return f'kind "{kind}" is not one of "cron", "once", "event"'
    if not isinstance(spec, Mapping):
        return f'spec must be an object such as {{"cron": "0 8 * * *"}}, not {_show(spec)}'
    problem = _problem(compile_schedule(kind, spec), time.time() if now is None else now)
    return None if problem is None else problem[1]


def chain_of(defn: TriggerDef) -> RunFilter | None:
    """Return the filter of a chain (an event trigger on `agent_runs` with a usable spec),
    else None."""
    schedule = defn.schedule
    return schedule.chain if isinstance(schedule, EventSchedule) else None


def chains_among(defs: Iterable[TriggerDef | Malformed]) -> dict[str, RunFilter]:
    """Return the enabled chains among `defs` by id, with their filters: what can loop."""
    out = {}
    for defn in defs:
        if type(defn) is TriggerDef and defn.enabled and (f := chain_of(defn)) is not None:
            out[defn.id] = f
    return out


def chain_loop(
    chains: Mapping[str, RunFilter], defn: TriggerDef | Malformed | None, rid: str
) -> str | None:
    """Return why writing `defn` as record `rid` among `chains` would close a loop of chains
    (`a → b → a`, for a refusal), or None."""
    others = {k: v for k, v in chains.items() if k != rid}
    if isinstance(defn, TriggerDef) and defn.enabled and (f := chain_of(defn)) is not None:
        loop = find_cycle({**others, rid: f}, rid)
        if loop is not None:
            return (
                f"this chain would trigger itself: {show_cycle(loop)}; a chain may not answer "
                "its own runs, directly or through other chains"
            )
    return None


def once_at(defn: TriggerDef) -> float | None:
    """Return the `at` of a valid once definition, else None."""
    return defn.schedule.at if isinstance(defn.schedule, OnceSchedule) else None
