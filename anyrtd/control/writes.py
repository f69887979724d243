"""Record writes the command line makes straight to the server: create, edit, pin, delete.

They need no running daemon: the record is the source of truth, and the owning
device adopts the change within one tick. Each write is checked first with the
same parser the daemon uses, so the CLI never writes a record the daemon would skip.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from anyrtd.chain import RunFilter
from anyrtd.client import DevicesView, ServerClient, Upsert
from anyrtd.model import (
    MAX_ID_LENGTH,
    STANDING_BUILTINS,
    Malformed,
    TriggerDef,
    chain_loop,
    chain_of,
    chains_among,
    parse_record,
    spec_error,
)
from anyrtd.places import BUNDLE, Places, resolve_places
from anyrtd.programs import args_problem
from anyrtd.programs.chat import GENERAL_CHAT_SEED
from anyrtd.standing import code_owned
from anyrtd.vocab import is_unassigned

ID_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{MAX_ID_LENGTH - 1}}}")


class WriteError(Exception):
    """A record write the CLI refuses; the message says what to change."""


@dataclass(frozen=True)
class Stored:
    """A trigger record as the server holds it."""

    id: str
    record: dict[str, Any]

    @property
    def fields(self) -> dict[str, Any]:
        """Return the record without its id and server bookkeeping (`_v`, `_updatedAt`)."""
        return {k: v for k, v in self.record.items() if k != "id" and not k.startswith("_")}


def check_id(trigger_id: str) -> str:
    """Return a valid record id, or raise with what a good one looks like."""
    if not ID_RE.fullmatch(trigger_id):
        raise WriteError(
            f"trigger id {trigger_id!r}: use a slug of letters, digits, '.', '_', ':' and '-' "
            f"(up to {MAX_ID_LENGTH}), e.g. remind-standup"
        )
    return trigger_id


def slug(name: str) -> str:
    """Return an id made from a display name: `Daily digest!` -> `daily-digest`."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:64]


def check_record(trigger_id: str, fields: Mapping[str, Any]) -> TriggerDef:
    """Parse a record as the daemon would; refuse one it would skip or mark as never firing."""
    parsed = parse_record({**fields, "id": trigger_id})
    if isinstance(parsed, Malformed):
        raise WriteError(f"trigger {trigger_id}: {parsed.reason}")
    problem = spec_error(parsed.kind, fields.get("spec"))
    if problem is not None:
        raise WriteError(f"trigger {trigger_id}: {problem}")
    problem = args_problem(parsed.program, parsed.args)
    if problem is not None:
        raise WriteError(f"trigger {trigger_id}: {problem}, so every run would fail")
    return parsed


def check_standing(trigger_id: str, fields: Iterable[str]) -> None:
    """Refuse a write to the code-owned fields of a standing built-in's record."""
    owned = code_owned(trigger_id, fields)
    if owned:
        raise WriteError(
            f"trigger {trigger_id} is a standing built-in: its {', '.join(owned)} are anyrtd's "
            f"own (docs/election.md); only enabled can change (`anyrtd triggers disable "
            f"{trigger_id}`)"
        )


def check_deletable(trigger_id: str) -> None:
    """Refuse to delete a standing built-in's record: the runtime needs it, and a deleted id
    stays deleted."""
    if trigger_id in STANDING_BUILTINS:
        raise WriteError(
            f"trigger {trigger_id} is a standing built-in: anyrtd needs its record, so it "
            f"cannot be deleted (docs/election.md); only enabled can change (`anyrtd triggers "
            f"disable {trigger_id}`)"
        )


class Records:
    """The trigger records of one agent space, through the server client."""

    def __init__(self, client: ServerClient, space: str) -> None:
        self.client = client
        self.space = space
        self._places: Places | None = None
        self._chains: dict[str, RunFilter] | None = None
        """The enabled chains on the server, read once a chain is written (anyrtd/chain.py),
        with this command's own checked writes laid over them (`apply -f` writes several)."""
        self._planned: dict[str, TriggerDef] = {}

    async def refuse_loop(self, trigger_id: str, defn: TriggerDef) -> None:
        """Refuse a chain that would trigger itself, directly or through other chains (the
        records on the server and this command's other writes); other records cost nothing."""
        self._planned[trigger_id] = defn
        if not (defn.enabled and chain_of(defn) is not None):
            if self._chains is not None:
                self._chains.pop(trigger_id, None)
            return
        if self._chains is None:
            places = await self.places()
            records = await self.client.query_all(places.triggers)
            self._chains = chains_among(parse_record(r) for r in records)
            for rid, planned in self._planned.items():
                self._chains.pop(rid, None)
                self._chains.update(chains_among([planned]))
        problem = chain_loop(self._chains, defn, trigger_id)
        if problem is not None:
            raise WriteError(f"trigger {trigger_id}: {problem}")
        self._chains.update(chains_among([defn]))

    async def places(self) -> Places:
        if self._places is None:
            self._places = await resolve_places(self.client, self.space)
        return self._places

    async def get(self, trigger_id: str) -> Stored | None:
        """Return the stored record; raise if its id is tombstoned; None if it never existed."""
        places = await self.places()
        records, _ = await self.client.query(
            places.triggers, filter={"id": trigger_id}, include_deleted=True
        )
        for record in records:
            if record.get("id") == trigger_id:
                if record.get("_deleted"):
                    raise WriteError(
                        f"trigger {trigger_id} was deleted, and a deleted id stays deleted: "
                        "create it under a new id"
                    )
                return Stored(trigger_id, dict(record))
        return None

    async def need(self, trigger_id: str) -> Stored:
        stored = await self.get(trigger_id)
        if stored is None:
            raise WriteError(
                f"no trigger {trigger_id} in space {self.space}: "
                "`anyrtd triggers list --all` shows the ones there are"
            )
        return stored

    async def create(
        self, trigger_id: str, fields: Mapping[str, Any], *, dry_run: bool = False
    ) -> TriggerDef:
        """Write a new record; refuse an id in use. `dry_run` checks and writes nothing."""
        check_id(trigger_id)
        check_standing(trigger_id, fields)
        defn = check_record(trigger_id, fields)
        if await self.get(trigger_id) is not None:
            raise WriteError(
                f"trigger {trigger_id} exists: change it with `anyrtd triggers edit {trigger_id}`"
            )
        await self.refuse_loop(trigger_id, defn)
        if dry_run:
            return defn
        places = await self.places()
        await self.client.replace(places.triggers, trigger_id, dict(fields))
        return defn

    async def update(
        self,
        trigger_id: str,
        fields: Mapping[str, Any],
        unset: Iterable[str] = (),
        *,
        dry_run: bool = False,
    ) -> TriggerDef:
        """Change some fields of an existing record (a field-level write), checked first."""
        stored = await self.need(trigger_id)
        unset = [k for k in unset if k not in fields]
        check_standing(trigger_id, [*fields, *unset])
        merged = {**stored.fields, **fields}
        for key in unset:
            merged.pop(key, None)
        defn = check_record(trigger_id, merged)
        await self.refuse_loop(trigger_id, defn)
        if dry_run:
            return defn
        places = await self.places()
        await self.client.upsert(places.triggers, [Upsert(trigger_id, dict(fields), unset)])
        return defn

    async def delete(self, trigger_id: str) -> None:
        check_deletable(trigger_id)
        await self.need(trigger_id)
        places = await self.places()
        await self.client.delete(places.triggers, [trigger_id])

    async def general_chat(self) -> str:
        """Return the object id of the agent space's general chat."""
        return await self.client.child(self.space, BUNDLE, GENERAL_CHAT_SEED)


def resolve_peer(devices: DevicesView | None, peer: str) -> str:
    """Return the peer id that `peer` names: a peer id, a device name, or `here`."""
    if devices is None:
        if peer in ("here", "self"):
            raise WriteError(
                "the server has no devices registry, so `here` cannot be resolved: give a peer id"
            )
        return peer
    if peer in ("here", "self"):
        return devices.self_id
    row = devices.row(peer)
    if row is None:
        named = [d for d in devices.devices if d.name == peer and not d.deleted]
        if len(named) > 1:
            raise WriteError(f"several devices are named {peer!r}: give the peer id")
        row = named[0] if named else None
    if row is None:
        if is_unassigned(peer):
            raise WriteError("to unassign a trigger use `anyrtd triggers unpin ID`")
        raise WriteError(
            f"no device {peer!r} in the devices registry: `anyrtd devices list` shows them "
            "(--force pins it anyway)"
        )
    if row.deleted:
        raise WriteError(
            f"device {row.peer_id} is pruned and fires nothing: pin the trigger to a live device"
        )
    return row.peer_id


def fill_placeholders(value: Any, known: Mapping[str, str]) -> Any:
    """Replace `${NAME}` strings anywhere in a JSON value by `known[NAME]`."""
    if isinstance(value, str):
        for name, text in known.items():
            value = value.replace("${" + name + "}", text)
        return value
    if isinstance(value, list):
        return [fill_placeholders(v, known) for v in value]
    if isinstance(value, dict):
        return {k: fill_placeholders(v, known) for k, v in value.items()}
    return value


def placeholders_in(value: Any) -> set[str]:
    """Return the `${NAME}` placeholders used anywhere in a JSON value."""
    if isinstance(value, str):
        return set(re.findall(r"\$\{([A-Z_]+)\}", value))
    if isinstance(value, list):
        return set().union(*(placeholders_in(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return set().union(*(placeholders_in(v) for v in value.values())) if value else set()
    return set()
