"""What a program implements and what a run reports: the leaf types that `programs/` and
entry-point programs import, apart from the runner that executes them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from anyrtd.vocab import RunStatus

if TYPE_CHECKING:
    from anyrtd.client import ServerClient
    from anyrtd.clock import Clock

ProgramFn = Callable[[Mapping[str, Any], "ProgramContext"], Awaitable[Mapping[str, Any] | None]]


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended, what it reported, and what it printed."""

    status: RunStatus
    error_type: str | None
    error: str | None
    started_at: float
    ended_at: float
    duration_ms: int
    result: Mapping[str, Any] = field(default_factory=dict)
    output: str = ""
    output_dropped: int = 0


@dataclass(frozen=True)
class ProgramContext:
    """What an in-process program's `main(args, ctx)` gets besides its args."""

    run_id: str
    trigger_id: str | None
    scheduled_at: float | None
    device: str
    agent_name: str
    space: str
    log: logging.Logger
    client: ServerClient
    clock: Clock
