"""The standing built-ins: six code-owned cron entries that only the active device runs.

`rollup`, `extraction`, `linkgen`, `evolution`, `decay`, `reflection` each map to a
program and carry their own schedule. The reconcile ignores their records; the daemon
puts these entries in its registry when this device takes the active role (armed strictly
forward: no wake-and-replay burst), stamps their records with its peer id, and takes them
out again when it stands down. An entry whose program is not installed here is listed
with the marker `not_installed` and never fires. Of the six, anyrtd ships `rollup` (the
chat digest, `agent:rollup@v1`) and `decay` (run-history retention, `internal:decay@v1`).
See docs/election.md.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from anyrtd.client import Dataset
from anyrtd.model import STANDING_BUILTINS, TriggerDef, parse_record
from anyrtd.registry import Entry, new_row
from anyrtd.vocab import Marker

if TYPE_CHECKING:
    from anyrtd.program import ProgramContext, ProgramFn

log = logging.getLogger("anyrtd.standing")

DECAY_PROGRAM = "internal:decay@v1"
_DELETE_CHUNK = 500


@dataclass(frozen=True)
class Standing:
    """One standing built-in: its id, display name, schedule (UTC cron) and program."""

    id: str
    name: str
    cron: str
    program: str

    def fields(self, owner: str) -> dict[str, Any]:
        """Return the record fields this device writes when it takes the role (not `enabled`:
        a user, or the breaker, may have turned the built-in off)."""
        return {
            "name": self.name,
            "kind": "cron",
            "spec": {"cron": self.cron},
            "program": self.program,
            "owner": owner,
        }


OWNED_FIELDS = frozenset({"name", "kind", "spec", "program", "owner"})
"""The fields of a standing built-in's record that the code owns: what `Standing.fields`
writes. Only `enabled` is the user's (docs/election.md)."""


def code_owned(trigger_id: str, fields: Iterable[str]) -> list[str]:
    """Return the code-owned fields among `fields` of a write to `trigger_id` (none unless it
    is a standing built-in), sorted."""
    if trigger_id not in STANDING_BUILTINS:
        return []
    return sorted(OWNED_FIELDS.intersection(fields))


STANDING: tuple[Standing, ...] = (
    Standing("rollup", "Chat digest", "0 8 * * *", "agent:rollup@v1"),
    Standing("extraction", "Memory extraction", "*/30 * * * *", "agent:extraction@v1"),
    Standing("linkgen", "Link generation", "15 */6 * * *", "agent:linkgen@v1"),
    Standing("evolution", "Evolution", "0 4 * * 0", "agent:evolution@v1"),
    Standing("decay", "Run-history retention", "30 3 * * *", DECAY_PROGRAM),
    Standing("reflection", "Reflection", "0 22 * * *", "agent:reflection@v1"),
)
STANDING_BY_ID: Mapping[str, Standing] = {s.id: s for s in STANDING}
assert set(STANDING_BY_ID) == STANDING_BUILTINS


def definition(standing: Standing, owner: str, record: Mapping[str, Any] | None) -> TriggerDef:
    """Return the entry's definition: the code's schedule and program over the record's
    `enabled` and rollup fields."""
    merged = {**(record or {}), **standing.fields(owner), "id": standing.id}
    parsed = parse_record(merged)
    if isinstance(parsed, TriggerDef):
        return parsed
    # The record's own fields are unreadable: the code-owned definition alone still runs.
    clean = parse_record({**standing.fields(owner), "id": standing.id})
    assert isinstance(clean, TriggerDef), clean
    return clean


def entries(
    owner: str,
    records: Callable[[str], Mapping[str, Any] | None],
    installed: Callable[[str], bool],
    now: float,
) -> list[Entry]:
    """Return fresh entries of the six built-ins, armed from `now` (the caller arms them)."""
    out = []
    for standing in STANDING:
        defn = definition(standing, owner, records(standing.id))
        row = new_row(defn, now, claimed=False)
        if not installed(standing.program):
            row.marker = Marker.NOT_INSTALLED
        out.append(Entry(defn, row))
    return out


def decay_program(
    *,
    runs: Callable[[], Dataset | None],
    prune_mirror: Callable[[float], Awaitable[int]],
    days: Callable[[], float],
) -> ProgramFn:
    """Return `internal:decay@v1`: delete `agent_runs` records, and mirror run rows, older than
    the configured number of days."""

    async def main(args: Mapping[str, Any], ctx: ProgramContext) -> dict[str, Any]:
        where = runs()
        if where is None:
            raise RuntimeError("the server's agent_runs dataset is not resolved yet")
        keep_days = days()
        cutoff = ctx.clock.now() - keep_days * 86400
        old = await ctx.client.query_all(where, filter={"startedAt": {"$lt": cutoff}})
        ids = [str(r["id"]) for r in old if isinstance(r.get("id"), str)]
        for i in range(0, len(ids), _DELETE_CHUNK):
            await ctx.client.delete(where, ids[i : i + _DELETE_CHUNK])
        local = await prune_mirror(cutoff)
        ctx.log.info(
            "pruned %d agent_runs records and %d mirror run rows older than %g days",
            len(ids),
            local,
            keep_days,
        )
        return {
            "title": f"Pruned {len(ids)} run records older than {keep_days:g} days",
            "mutations": len(ids) + local,
        }

    return main


__all__ = [
    "DECAY_PROGRAM",
    "OWNED_FIELDS",
    "STANDING",
    "STANDING_BUILTINS",
    "STANDING_BY_ID",
    "Standing",
    "code_owned",
    "decay_program",
    "definition",
    "entries",
]
