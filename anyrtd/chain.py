"""Chains: event triggers on run records (`dataset: agent_runs`). Pure, clock-free.

A chain's spec is `{"dataset": "agent_runs", "filter": {"triggerId": ID or [IDs],
"status": STATUS or [STATUSES] or "any" (default "ok"), "device": PEER}}`; every key of
`filter` is optional. This module holds what the rest of the package asks of one:

- `parse_filter`: the filter of a spec, or why it is unusable (the schedule module compiles
  a chain's spec with it, so a bad filter is an `invalid_spec` marker and a refused write);
- `UpstreamRun` and `upstream_run`: a run record, as the change feed brings it, that a chain
  may answer (only a run that ended: a record still `running` answers nothing);
- `matches`: whether a filter takes an upstream run;
- `chained_run_id`: the run id of the one run a chain makes for an upstream run, the same
  on every device, so the run's record is one record whoever writes it;
- `find_cycle`, `cycles`: the loops chains form through their `triggerId`s;
- `CHAIN_DEPTH_LIMIT`: how deep a run started by a chain may be;
- `describe`: "after each ok run of nightly-backup".

A filter without `triggerId` answers the runs of every trigger that a chain did not start
(depth 0): it can never form a loop, so only chains that name their upstreams take part in
the cycle check. See docs/events.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from anyrtd.vocab import ENDED_STATUSES, RunStatus

RUNS_DATASET = "agent_runs"
STATUS_ANY = "any"
DEFAULT_STATUS = RunStatus.OK
CHAIN_DEPTH_LIMIT = 8
"""The deepest run a chain starts: a run answering a run of depth 8 (one started by the
eighth chain in a row) is not started. Deep enough for any pipeline a person writes, and a
loop the cycle check could not see (records written on two devices at once) stops there."""
FILTER_KEYS = ("triggerId", "status", "device")
_CANONICAL_STATUS = {s.value.casefold(): s.value for s in ENDED_STATUSES}


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Which run records fire a chain."""

    trigger_ids: frozenset[str] | None
    """The upstream triggers; None: every trigger's runs that no chain started."""
    statuses: frozenset[str] | None
    """The run statuses that fire it; None: every status a run ends with."""
    device: str | None = None
    """Only runs recorded by this device (peer id); None: any device."""


@dataclass(frozen=True, slots=True)
class UpstreamRun:
    """A run that ended, as its `agent_runs` record says."""

    run_id: str
    trigger_id: str
    status: str
    device: str
    started_at: float | None
    ended_at: float | None
    depth: int
    """How many chains in a row led to this run (0: a run no chain started)."""
    record_id: str
    seq: int = 0

    def payload(self, ref: Mapping[str, str]) -> dict[str, Any]:
        """Return the `event` object the chained program receives; `ref` names the record."""
        return {
            "runId": self.run_id,
            "triggerId": self.trigger_id,
            "status": self.status,
            "device": self.device,
            "startedAt": self.started_at,
            "endedAt": self.ended_at,
            "depth": self.depth,
            "ref": {**ref, "id": self.record_id},
        }


@dataclass(frozen=True, slots=True)
class Answer:
    """The run a chain makes for an upstream run: its id, the upstream's, and its depth."""

    run_id: str
    upstream_run_id: str
    depth: int

    @classmethod
    def to(cls, chain_id: str, upstream: UpstreamRun) -> Answer:
        """Return the answer of chain `chain_id` to `upstream`."""
        return cls(chained_run_id(chain_id, upstream.run_id), upstream.run_id, upstream.depth + 1)


def is_runs_dataset(name: str) -> bool:
    """Return True for `agent_runs` by its short or its collection name."""
    return name == RUNS_DATASET or name.endswith("_" + RUNS_DATASET)


def _strings(value: Any, key: str) -> frozenset[str] | str:
    """Return a string or a non-empty list of strings as a set, or why it is neither."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        return f"filter.{key} must be a string or a non-empty list of strings, not {value!r:.60}"
    if not all(isinstance(v, str) and v for v in items):
        return f"filter.{key} must hold non-empty strings only, not {value!r:.60}"
    return frozenset(items)


def parse_filter(raw: Any) -> RunFilter | str:
    """Return the filter of a chain's spec (`raw` is `spec.filter`, None when absent), or a
    sentence that says why it is unusable."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return (
            f'filter must be an object such as {{"triggerId": "nightly-backup"}}, not {raw!r:.60}'
        )
    unknown = sorted(str(k) for k in raw if k not in FILTER_KEYS)
    if unknown:
        return (
            f"filter key {unknown[0]!r} is not one of triggerId, status, device; a chain "
            'filter reads like {"triggerId": "nightly-backup", "status": "ok"}'
        )
    trigger_ids: frozenset[str] | None = None
    if raw.get("triggerId") is not None:
        got = _strings(raw["triggerId"], "triggerId")
        if isinstance(got, str):
            return got
        trigger_ids = got
    statuses: frozenset[str] | None = frozenset({DEFAULT_STATUS.value})
    if raw.get("status") is not None:
        got = _strings(raw["status"], "status")
        if isinstance(got, str):
            return got
        if STATUS_ANY in got:
            if len(got) > 1:
                return 'filter.status "any" takes every status: give it alone'
            statuses = None
        else:
            canonical = set()
            for status in sorted(got):
                known = _CANONICAL_STATUS.get(status.casefold())
                if known is None:
                    shown = ", ".join(s.value for s in ENDED_STATUSES)
                    return (
                        f"filter.status {status!r:.40} is not a status a run ends with "
                        f'({shown}, or "any")'
                    )
                canonical.add(known)
            statuses = frozenset(canonical)
    device = raw.get("device")
    if device is not None and (not isinstance(device, str) or not device):
        return f"filter.device must be a peer id (a non-empty string), not {device!r:.60}"
    return RunFilter(trigger_ids, statuses, device)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def upstream_run(record: Mapping[str, Any], record_id: str, seq: int = 0) -> UpstreamRun | None:
    """Return the ended run an `agent_runs` record describes, or None (a run still in
    flight, a record without a run id or trigger id, a deleted one)."""
    if record.get("_deleted"):
        return None
    status, trigger_id = record.get("status"), record.get("triggerId")
    if status not in _ENDED or not isinstance(trigger_id, str) or not trigger_id:
        return None
    run_id = record.get("runId", record_id)
    if not isinstance(run_id, str) or not run_id:
        return None
    device = record.get("device")
    depth = record.get("chainDepth")
    return UpstreamRun(
        run_id=run_id,
        trigger_id=trigger_id,
        status=str(status),
        device=device if isinstance(device, str) else "",
        started_at=_number(record.get("startedAt")),
        ended_at=_number(record.get("endedAt")),
        depth=depth if isinstance(depth, int) and not isinstance(depth, bool) and depth > 0 else 0,
        record_id=record_id,
        seq=seq,
    )


_ENDED = frozenset(s.value for s in ENDED_STATUSES)


def matches(f: RunFilter, run: UpstreamRun) -> bool:
    """Return True when the filter takes the run."""
    if f.trigger_ids is None:
        if run.depth:
            return False  # a wildcard answers no chain's run: it could loop
    elif run.trigger_id not in f.trigger_ids:
        return False
    if f.statuses is not None and run.status not in f.statuses:
        return False
    return f.device is None or run.device == f.device


def chained_run_id(chain_id: str, upstream_run_id: str) -> str:
    """Return the id of the run chain `chain_id` makes for `upstream_run_id`: the same on
    every device and at every try, so that run's record is written once."""
    text = f"chain\0{chain_id}\0{upstream_run_id}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def find_cycle(chains: Mapping[str, RunFilter], start: str) -> list[str] | None:
    """Return a loop through `start` (`[start, …, start]`) that the chains form, or None.

    `chains` maps each chain's trigger id to its filter; a run of trigger T fires every
    chain whose `triggerId` names T.
    """
    fired_by: dict[str, list[str]] = {}
    for cid, f in chains.items():
        for tid in f.trigger_ids or ():
            fired_by.setdefault(tid, []).append(cid)
    path = [start]
    seen = {start}

    def walk(node: str) -> list[str] | None:
        for nxt in sorted(fired_by.get(node, ())):
            if nxt == start:
                return [*path, start]
            if nxt in seen:
                continue
            seen.add(nxt)
            path.append(nxt)
            found = walk(nxt)
            if found is not None:
                return found
            path.pop()
        return None

    return walk(start)


def cycles(chains: Mapping[str, RunFilter]) -> dict[str, list[str]]:
    """Return, for each chain that is part of a loop, one loop through it."""
    out: dict[str, list[str]] = {}
    for cid in sorted(chains):
        if cid not in out and (loop := find_cycle(chains, cid)) is not None:
            out[cid] = loop
    return out


def show_cycle(loop: Iterable[str]) -> str:
    """Return a loop as `a → b → a`."""
    return " → ".join(loop)


class ChainIndex:
    """The chains among the records a device knows (every device's, by trigger id), and the
    loops they form, worked out again only when a chain changed."""

    def __init__(self) -> None:
        self.filters: dict[str, RunFilter] = {}
        self._cycles: dict[str, list[str]] = {}
        self._stale = False

    def __bool__(self) -> bool:
        return bool(self.filters)

    def note(self, rid: str, f: RunFilter | None) -> None:
        """Note that record `rid` is the chain `f` (None: not a chain, or gone)."""
        if self.filters.get(rid) == f:
            return
        if f is None:
            del self.filters[rid]
        else:
            self.filters[rid] = f
        self._stale = True

    def settle(self) -> set[str]:
        """Work the loops out again if a chain changed; return the chains that joined or
        left a loop."""
        if not self._stale:
            return set()
        self._stale = False
        before = self._cycles
        self._cycles = cycles(self.filters)
        return set(before).symmetric_difference(self._cycles)

    @property
    def cycles(self) -> Mapping[str, list[str]]:
        """A loop through each chain that is in one (as of the last `settle`)."""
        return self._cycles


def describe(f: RunFilter) -> str:
    """Return when a chain fires, in words: "after each ok run of nightly-backup"."""
    statuses = "" if f.statuses is None else " or ".join(sorted(f.statuses)) + " "
    if f.trigger_ids is None:
        upstream = "any trigger (no chain's run)"
    else:
        upstream = ", ".join(sorted(f.trigger_ids))
    where = f" on {f.device}" if f.device is not None else ""
    return f"after each {statuses}run of {upstream}{where}"


__all__ = [
    "CHAIN_DEPTH_LIMIT",
    "DEFAULT_STATUS",
    "RUNS_DATASET",
    "STATUS_ANY",
    "Answer",
    "ChainIndex",
    "RunFilter",
    "UpstreamRun",
    "chained_run_id",
    "cycles",
    "describe",
    "find_cycle",
    "is_runs_dataset",
    "matches",
    "parse_filter",
    "show_cycle",
    "upstream_run",
]
