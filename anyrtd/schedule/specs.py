"""A trigger's spec compiled into a `Schedule`: cron (UTC or a zone), every_s, once or
event, or an `InvalidSchedule` that says why it can never fire; and previews."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

from anyrtd.chain import RunFilter, is_runs_dataset, parse_filter
from anyrtd.schedule.match import CronExpr, CronMatcher, civil, epoch
from anyrtd.schedule.parse import CronSyntaxError, cron_size_error, parse_cron
from anyrtd.schedule.zones import MAX_TZ_LENGTH, fold_end_wall, offset_s, to_instant, zone_of
from anyrtd.vocab import Kind

#: The largest accepted `every_s`: a hundred years. Larger intervals are almost certainly typos
#: (milliseconds for seconds) and would arm beyond any date the tools can show.
MAX_EVERY_S = 100 * 365.25 * 86400.0

#: The smallest accepted `every_s`: one second, cron's finest grain. A smaller interval fires
#: faster than any schedule needs and floods the run records (0.001 s is 86 million a day).
MIN_EVERY_S = 1.0

#: The instants a date can be shown for in every zone: 0001-01-02 to 9999-12-31 UTC, a day
#: inside what Python's datetime reaches. A once's `at` outside them is refused.
FIRST_AT = -62135510400.0
LAST_AT = 253402214400.0


@runtime_checkable
class Schedule(Protocol):
    """A compiled schedule: the next fire time strictly after a given time, or None for never."""

    @property
    def error(self) -> str | None: ...

    @property
    def is_valid(self) -> bool: ...

    def next_after(self, after: float, anchor: float) -> float | None: ...


@dataclass(frozen=True, slots=True)
class InvalidSchedule:
    """A spec that can never fire; `error` says why and what to write instead."""

    error: str

    @property
    def is_valid(self) -> bool:
        return False

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return None: an invalid spec never fires."""
        return None


@dataclass(frozen=True, slots=True)
class EverySchedule:
    """`{"every_s": n}`: fire on the grid anchor + k*n, k >= 1."""

    every_s: float
    error: None = None

    @property
    def is_valid(self) -> bool:
        return True

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return the first grid point anchor + k*n (k >= 1) strictly after `after`."""
        n = self.every_s
        k = max(1, math.floor((after - anchor) / n) + 1)
        t = anchor + k * n
        # Float rounding can land the product on or just below `after`; step until strictly past.
        while t <= after:
            k += 1
            t = anchor + k * n
        return t


@dataclass(frozen=True, slots=True)
class OnceSchedule:
    """`{"at": epoch}`: one fire at `at`. See `once_due` for how a once is armed."""

    at: float
    error: None = None

    @property
    def is_valid(self) -> bool:
        return True

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return `at` if it lies strictly after `after`, else None."""
        return self.at if self.at > after else None


@dataclass(frozen=True, slots=True)
class EventSchedule:
    """An event trigger: it fires on a change, never on a time, so `next_after` is None."""

    dataset: str
    object_id: str
    space_id: str | None
    error: None = None
    chain: RunFilter | None = None
    """A chain's filter (`dataset: agent_runs`, anyrtd/chain.py); None on any other dataset."""

    @property
    def is_valid(self) -> bool:
        return True

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return None: event triggers are not armed on the clock."""
        return None


def once_due(at: float | None, last_run_at: float | None) -> float | None:
    """Return a once's due time (`at`, even if past: late beats lost); None if consumed."""
    if at is None or last_run_at is not None:
        return None
    return at


class CronSchedule:
    """A compiled cron expression in UTC or an IANA zone, with cron(8) DST rules."""

    __slots__ = ("_matcher", "_step", "_zone", "expr", "tz")

    def __init__(self, expr: CronExpr, tz: str | None, zone: tzinfo | None) -> None:
        self.expr = expr
        self.tz = tz
        self._zone = zone
        self._matcher = CronMatcher(expr)
        self._step = 1 if expr.has_seconds else 60

    @property
    def error(self) -> str | None:
        return None

    @property
    def is_valid(self) -> bool:
        return True

    def __repr__(self) -> str:
        zone = f", tz={self.tz!r}" if self.tz else ""
        return f"CronSchedule({self.expr.text!r}{zone})"

    def _start(self, wall: int) -> tuple[int, int, int, int, int, int]:
        """Return the naive fields of the first candidate strictly after `wall` (whole seconds)."""
        step = self._step
        return civil(wall - wall % step + step)

    def next_after(self, after: float, anchor: float) -> float | None:
        """Return the first occurrence strictly after `after`; `anchor` is ignored for cron."""
        if not math.isfinite(after) or not -62135596800.0 < after < 253402300799.0:
            return None
        zone = self._zone
        if zone is None:
            found = self._matcher.first_at_or_after(*self._start(math.floor(after)))
            return None if found is None else float(epoch(*found))
        try:
            return self._next_in_zone(after, zone)
        except (OverflowError, ValueError):  # a match past year 9999 has no local time
            return None

    def _next_in_zone(self, after: float, zone: tzinfo) -> float | None:
        """Search in local wall time, then map each local match to one instant (cron(8) rules).

        A local time inside a spring-forward gap fires at the instant the gap ends when the
        job is at a fixed time (its minute and hour do not start with `*`); a wildcard job
        runs on the new time, so its times in the gap are skipped (cron(8)). A local time
        that occurs twice maps to its first occurrence. The map is monotonic, so the first
        local match whose instant is after `after` is the answer.
        """
        local = datetime.fromtimestamp(after, zone)
        offset = local.utcoffset() or timedelta(0)
        wall = math.floor(after) + int(offset.total_seconds())
        if local.fold == 1:
            # In the second pass of a repeated hour: every local time up to the end of the
            # repetition already fired during the first pass, so search from its end.
            wall = max(wall, fold_end_wall(after, zone, local) - 1)
        start = self._start(wall)
        while True:
            found = self._matcher.first_at_or_after(*start)
            if found is None:
                return None
            instant, in_gap = to_instant(found, zone)
            if in_gap and not self.expr.fixed_time:
                # Search again from the first local time after the gap.
                start = civil(instant + offset_s(datetime.fromtimestamp(instant, zone)))
                continue
            if instant > after:
                return float(instant)
            # Only reachable at the edges of a transition; continue just past this match.
            start = civil(epoch(*found) + 1)


@lru_cache(maxsize=8192)
def _compile_cron(expr: str, tz: str | None) -> CronSchedule | InvalidSchedule:
    """Compile a cron expression in a zone once; the LRU shares it across definitions."""
    zone: tzinfo | None = None
    if tz is not None:
        zone, problem = zone_of(tz)
        if problem is not None:
            return InvalidSchedule(problem)
    try:
        parsed = parse_cron(expr)
    except CronSyntaxError as exc:
        return InvalidSchedule(str(exc))
    return CronSchedule(parsed, tz, zone)


def _number(v: Any) -> float | None:
    """Return v as a finite float if it is a JSON number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def compile_schedule(kind: str, spec: Mapping[str, Any]) -> Schedule:
    """Compile a trigger's spec into a Schedule; an unusable spec gives an InvalidSchedule."""
    try:
        return _compile(kind, spec)
    except Exception as exc:  # never let a strange spec escape as an exception
        return InvalidSchedule(f"{kind} spec could not be read: {exc}")


def _compile(kind: str, spec: Mapping[str, Any]) -> Schedule:
    if not isinstance(spec, Mapping):
        return InvalidSchedule(f"spec must be an object, not {type(spec).__name__}")
    if kind == Kind.CRON:
        has_cron, has_every = "cron" in spec, "every_s" in spec
        if has_cron and has_every:
            return InvalidSchedule('cron spec has both "cron" and "every_s"; keep one')
        if has_every:
            raw = spec["every_s"]
            n = _number(raw)
            if n is None:
                return InvalidSchedule(f"every_s must be a number of seconds, not {raw!r}")
            if n < MIN_EVERY_S:
                return InvalidSchedule(
                    f"every_s {raw!r} is less than the minimum of 1 second (cron's finest "
                    "grain); give 1 or more"
                )
            if n > MAX_EVERY_S:
                return InvalidSchedule(
                    f"every_s {raw!r} is more than 100 years; give the interval in seconds"
                )
            return EverySchedule(n)
        if not has_cron:
            return InvalidSchedule(
                'cron spec needs "cron" (like {"cron": "0 8 * * *"}) or "every_s" '
                '(like {"every_s": 300})'
            )
        expr = spec["cron"]
        if not isinstance(expr, str):
            return InvalidSchedule(
                f'cron expression must be a string like "0 8 * * *", not {expr!r}'
            )
        # Sizes first, before the LRU below keeps the text as a key and before any parsing.
        too_long = cron_size_error(expr)
        if too_long is not None:
            return InvalidSchedule(too_long)
        tz = spec.get("tz")
        if tz is not None and not isinstance(tz, str):
            return InvalidSchedule(f'tz must be an IANA zone name like "Europe/Berlin", not {tz!r}')
        if tz is not None and len(tz) > MAX_TZ_LENGTH:
            return InvalidSchedule(
                f'tz "{tz[:40]}…" is {len(tz):,} characters long; an IANA zone name like '
                f'"Europe/Berlin" has at most {MAX_TZ_LENGTH}'
            )
        return _compile_cron(expr, tz)
    if kind == Kind.ONCE:
        raw = spec.get("at")
        at = _number(raw)
        if at is None:
            return InvalidSchedule(
                f'once spec needs a numeric "at" (unix seconds, like {{"at": 1787000000}}), '
                f"not {raw!r}"
            )
        if not FIRST_AT <= at <= LAST_AT:
            return InvalidSchedule(
                f'once "at" {raw!r} is outside the years 1 to 9999; give unix seconds, like '
                '{"at": 1787000000}'
            )
        return OnceSchedule(at)
    if kind == Kind.EVENT:
        if isinstance(spec.get("dataset"), str) and is_runs_dataset(spec["dataset"]):
            return _chain(spec)
        dataset, object_id, space_id = (
            spec.get("dataset"),
            spec.get("objectId"),
            spec.get("spaceId"),
        )
        missing = [
            k
            for k, v in (("dataset", dataset), ("objectId", object_id))
            if not isinstance(v, str) or not v
        ]
        if missing:
            return InvalidSchedule(
                f"event spec needs {' and '.join(missing)} as non-empty strings, like "
                '{"dataset": "chat_messages", "objectId": "<chat id>"}'
            )
        if space_id is not None and not isinstance(space_id, str):
            return InvalidSchedule(f"event spaceId must be a string, not {space_id!r}")
        assert isinstance(dataset, str) and isinstance(object_id, str)
        return EventSchedule(dataset, object_id, space_id)
    return InvalidSchedule(f'kind "{kind}" is not one of cron, once, event')


def _chain(spec: Mapping[str, Any]) -> Schedule:
    """Compile a chain's spec: an event on the agent's own run records (anyrtd/chain.py)."""
    if spec.get("spaceId") is not None:
        return InvalidSchedule(
            "an agent_runs event listens on this agent's run records: spaceId is not used "
            "there; remove it"
        )
    object_id = spec.get("objectId")
    if object_id is not None and not isinstance(object_id, str):
        return InvalidSchedule(f"event objectId must be a string, not {object_id!r:.60}")
    found = parse_filter(spec.get("filter"))
    if isinstance(found, str):
        return InvalidSchedule(f"chain spec refused: {found}")
    return EventSchedule(spec["dataset"], object_id or "", None, chain=found)


def preview(
    defn_or_schedule: Schedule | Any, after: float, n: int, anchor: float | None = None
) -> list[float]:
    """Return the next `n` fire times after `after` of a definition or schedule.

    For a definition, a once that has not run shows its due time even when it is in the past
    (it fires on the next tick); a consumed once and an event trigger show nothing.
    """
    anchor = after if anchor is None else anchor
    schedule = getattr(defn_or_schedule, "schedule", defn_or_schedule)
    if isinstance(schedule, OnceSchedule) and hasattr(defn_or_schedule, "rollup"):
        due = once_due(schedule.at, defn_or_schedule.rollup.last_run_at)
        return [] if due is None or n < 1 else [due]
    times: list[float] = []
    t = after
    while len(times) < n:
        nxt = schedule.next_after(t, anchor)
        if nxt is None:
            break
        times.append(nxt)
        t = nxt
    return times
