"""The gate between the election and the daemon: which verdict this device holds."""

from __future__ import annotations

from typing import Any, Literal, Protocol

Verdict = Literal["active", "standby", "pruned"]
APP = "bao"


class Gate(Protocol):
    """The election as the daemon sees it: the current verdict, never recomputed locally."""

    @property
    def verdict(self) -> Verdict: ...

    def describe(self, peer_id: str | None) -> dict[str, Any]:
        """Return the `GET /election` body."""
        ...


class AlwaysActive:
    """Single-device behaviour (the seeds' Degrade): the gate is always active."""

    @property
    def verdict(self) -> Verdict:
        return "active"

    def describe(self, peer_id: str | None) -> dict[str, Any]:
        return {
            "app": APP,
            "enabled": False,
            "active": True,
            "peerId": peer_id,
            "winner": peer_id,
            "verdict": "active",
            "lastPollAt": None,
        }
