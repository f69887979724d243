"""The gate between the election and the daemon: which verdict this device holds."""

from __future__ import annotations

from typing import Literal, Protocol

Verdict = Literal["active", "standby", "pruned"]


class Gate(Protocol):
    """The election as the daemon sees it: the current verdict, never recomputed locally."""

    @property
    def verdict(self) -> Verdict: ...


class AlwaysActive:
    """Single-device behaviour (the seeds' Degrade): the gate is always active."""

    enabled = False

    @property
    def verdict(self) -> Verdict:
        return "active"
