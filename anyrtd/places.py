"""Where an agent's records live on the server: the hidden trigger type and the `bao/v1`
bundle's children, resolved by seed (seeds, Scheduling)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from anyrtd.client import Change, Dataset, ServerClient

BUNDLE = "bao/v1"
TRIGGERS_SEED = "bao/triggers/v1"
RUNS_SEED = "bao/runs/v1"
TRIGGER_TYPE_KEY = "agent_trigger"
NOTICES_DATASET = "agent_notices"


@dataclass(frozen=True)
class Places:
    """Where this agent's records live on the server, resolved by seed."""

    space: str
    type_id: str
    triggers: Dataset
    runs: Dataset

    @property
    def notices(self) -> Dataset:
        """The notices' marks, one record per notice made (anyrtd/notices.py), beside the
        trigger records on their object but in a dataset of their own: a user's write of a
        trigger record, a whole one included, cannot erase them."""
        return Dataset(self.space, self.triggers.object_id, f"{self.type_id}_{NOTICES_DATASET}")

    def matches_triggers(self, change: Change) -> bool:
        return change.object_id == self.triggers.object_id and change.dataset in (
            "agent_triggers",
            self.triggers.name,
        )

    def to_meta(self) -> dict[str, str]:
        return {
            "space": self.space,
            "type_id": self.type_id,
            "triggers_object": self.triggers.object_id,
            "runs_object": self.runs.object_id,
        }

    @classmethod
    def from_meta(cls, meta: Mapping[str, str]) -> Places | None:
        try:
            space, type_id = meta["space"], meta["type_id"]
            return cls(
                space,
                type_id,
                Dataset(space, meta["triggers_object"], f"{type_id}_agent_triggers"),
                Dataset(space, meta["runs_object"], f"{type_id}_agent_runs"),
            )
        except KeyError:
            return None


async def resolve_places(client: ServerClient, space: str) -> Places:
    """Resolve the trigger type and the bundle children by seed, creating them if missing."""
    type_id = await client.ensure_type(
        space, TRIGGER_TYPE_KEY, name="Agent trigger", hidden=True, id_rule="user", dynamic=True
    )
    triggers = await client.child(space, BUNDLE, TRIGGERS_SEED, type_id)
    runs = await client.child(space, BUNDLE, RUNS_SEED, type_id)
    return Places(
        space,
        type_id,
        Dataset(space, triggers, f"{type_id}_agent_triggers"),
        Dataset(space, runs, f"{type_id}_agent_runs"),
    )
