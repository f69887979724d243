"""The active-instance election: which verdict this device holds, as the server decides it.

The devices registry computes one winner per app slug (`active.bao` on `GET /v1/devices`);
this module registers the device under `bao`, polls that verdict, and claims the role
when nobody holds it. It never recomputes the winner locally. See docs/election.md.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import socket
import time
from typing import Any, Protocol

from anyrtd import __version__
from anyrtd.claims import Term, term_of
from anyrtd.client import DevicesView, ServerClient, ServerError, ServerUnavailable
from anyrtd.clock import Clock, SystemClock
from anyrtd.vocab import Verdict

log = logging.getLogger("anyrtd.election")

APP = "bao"


class Gate(Protocol):
    """The election as the daemon sees it: the current verdict, never recomputed locally."""

    @property
    def verdict(self) -> Verdict: ...

    @property
    def poll_interval_s(self) -> float | None:
        """Seconds between polls, or None when there is nothing to poll."""
        ...

    @property
    def term(self) -> Term | None:
        """The role's claims as last read (see anyrtd/claims.py), or None without an election."""
        ...

    async def boot(self) -> None:
        """Register this device and read the first verdict (or degrade)."""
        ...

    async def poll(self) -> Verdict:
        """Read the verdict once and return it."""
        ...

    def describe(self, peer_id: str | None) -> dict[str, Any]:
        """Return the `GET /election` body."""
        ...

    @property
    def self_id(self) -> str | None:
        """This device's peer id as the registry's `self` last said it; None when not known."""
        ...

    @property
    def degraded(self) -> str | None:
        """Why the registry is not doing its part while it fails; None when it is fine or absent."""
        ...

    def recent_view(self, within_s: float) -> DevicesView | None:
        """Return the devices registry as the last poll read it, when that was less than
        `within_s` ago; None otherwise, or without an election."""
        ...


class AlwaysActive:
    """Single-device behaviour (the seeds' Degrade): the gate is always active."""

    @property
    def verdict(self) -> Verdict:
        return Verdict.ACTIVE

    @property
    def poll_interval_s(self) -> float | None:
        return None

    @property
    def term(self) -> Term | None:
        return None

    async def boot(self) -> None:
        return None

    async def poll(self) -> Verdict:
        return Verdict.ACTIVE

    @property
    def self_id(self) -> str | None:
        return None

    @property
    def degraded(self) -> str | None:
        return None

    def recent_view(self, within_s: float) -> DevicesView | None:
        return None

    def describe(self, peer_id: str | None) -> dict[str, Any]:
        return {
            "app": APP,
            "enabled": False,
            "active": True,
            "peerId": peer_id,
            "winner": peer_id,
            "verdict": Verdict.ACTIVE,
            "lastPollAt": None,
        }


class Election:
    """One device's view of the `bao` election, polled from its own server's devices registry.

    Before `boot()` the verdict is `standby` (claim nothing until the server has spoken).
    A server without the registry (404), or a registration that fails `boot_tries` times,
    disables the election for the run: the gate is then always active. A read error
    after that keeps the last verdict, so the gate never flaps.
    """

    def __init__(
        self,
        client: ServerClient,
        *,
        poll_s: float = 10.0,
        clock: Clock | None = None,
        version: str = __version__,
        name: str | None = None,
        os_name: str | None = None,
        boot_tries: int = 3,
        retry_s: float = 1.0,
    ) -> None:
        self.client = client
        self.clock: Clock = clock or SystemClock()
        self._poll_s = poll_s
        self.version = version
        self.name = name if name is not None else socket.gethostname()
        self.os_name = os_name if os_name is not None else platform.system().lower()
        self.boot_tries = max(1, boot_tries)
        self.retry_s = retry_s
        self.enabled = True
        self.disabled_reason: str | None = None
        self.peer_id: str | None = None
        self.winner: str | None = None
        self.last_poll_at: float | None = None
        self._view: tuple[DevicesView, float] | None = None
        """The registry as the last poll read it, and when (monotonic)."""
        self._term: Term | None = None
        self._verdict: Verdict = Verdict.STANDBY
        self._recorded_winner: str | None = None
        self._failing: str | None = None
        self._failing_since: float | None = None
        self._boot_failure: str | None = None

    # the Gate

    @property
    def verdict(self) -> Verdict:
        return Verdict.ACTIVE if not self.enabled else self._verdict

    @property
    def poll_interval_s(self) -> float | None:
        return self._poll_s if self.enabled else None

    @property
    def term(self) -> Term | None:
        return self._term if self.enabled else None

    @property
    def self_id(self) -> str | None:
        return self.peer_id if self.enabled else None

    @property
    def degraded(self) -> str | None:
        if self._boot_failure is not None:
            failure = self._boot_failure
            return f"devices registry unavailable at boot ({failure}): single-device mode"
        if self._failing is not None and self._failing_since is not None:
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._failing_since))
            return f"devices registry unavailable since {since}: keeping verdict {self._verdict}"
        return None

    def recent_view(self, within_s: float) -> DevicesView | None:
        if not self.enabled or self._view is None:
            return None
        view, at = self._view
        return view if self.clock.monotonic() - at < within_s else None

    def describe(self, peer_id: str | None) -> dict[str, Any]:
        me = peer_id or self.peer_id
        return {
            "app": APP,
            "enabled": self.enabled,
            "active": self.verdict == Verdict.ACTIVE,
            "peerId": me,
            "winner": self.winner if self.enabled else me,
            "verdict": self.verdict,
            "lastPollAt": self.last_poll_at,
        }

    # boot and poll

    async def boot(self) -> None:
        """Register under `bao` (a few tries), then read the first verdict; degrade on failure."""
        last: Exception | None = None
        for attempt in range(self.boot_tries):
            try:
                await self._register()
                last = None
                break
            except ServerError as exc:
                if exc.status == 404:
                    self._disable("the server has no devices registry (404)")
                    return
                if exc.code == Verdict.PRUNED:
                    self._set(Verdict.PRUNED)
                    last = None
                    break
                last = exc
            except ServerUnavailable as exc:
                last = exc
            if attempt + 1 < self.boot_tries:
                # Real time on purpose: this waits on the server, not on the schedule.
                await asyncio.sleep(self.retry_s)
        if last is not None:
            self._boot_failure = f"registration failed {self.boot_tries} times (last: {last})"
            self._disable(self._boot_failure)
            return
        await self.poll(boot=True)

    async def poll(self, *, boot: bool = False) -> Verdict:
        """Read the registry once, claim the role if nobody holds it, and return the verdict."""
        if not self.enabled:
            return Verdict.ACTIVE
        try:
            view = await self.client.devices()
            if view is None:
                if boot:
                    self._disable("the server has no devices registry (404)")
                    return Verdict.ACTIVE
                raise ServerUnavailable("GET /v1/devices answered 404")
            view = await self._settle(view)
        except (ServerUnavailable, ServerError) as exc:
            self._read_failed(exc)
            return self.verdict
        if self._failing is not None:
            log.info("the devices registry answers again; verdict %s", self._verdict)
            self._failing = self._failing_since = None
        self.last_poll_at = self.clock.now()
        self._view = (view, self.clock.monotonic())
        return self.verdict

    async def _settle(self, view: DevicesView) -> DevicesView:
        """Register again if our row lost `bao`, claim if nobody holds the role; set the verdict."""
        me = view.self_id
        if me and me != self.peer_id:
            if self.peer_id is not None:
                log.info("this device's peer id changed from %s to %s", self.peer_id, me)
                if self._recorded_winner == self.peer_id:
                    # A fresh init: the old row was this device, not a winner that went away.
                    self._recorded_winner = None
            self.peer_id = me
        row = view.row(me)
        if row is not None and row.deleted:
            self.winner = view.active.get(APP)
            self._set(Verdict.PRUNED)
            return view
        if row is None or APP not in row.apps:
            try:
                await self._register()
            except ServerError as exc:
                if exc.code != Verdict.PRUNED:
                    raise
                self._set(Verdict.PRUNED)
                return view
            view = await self._read()
        winner = view.active.get(APP)
        if self._should_claim(view, me, winner):
            log.info(
                "claiming the %s role: %s",
                APP,
                "nobody holds it" if winner is None else f"the winner {winner} is gone",
            )
            await self.client.activate(APP)
            view = await self._read()
            winner = view.active.get(APP)
        self.winner = winner
        self._recorded_winner = winner
        rows = (
            (d.peer_id, d.deleted or APP not in d.apps, d.apps.get(APP, {})) for d in view.devices
        )
        self._term = term_of(rows, me, winner, read_at=self.clock.now())
        self._set(Verdict.ACTIVE if winner == me else Verdict.STANDBY)
        return view

    def _should_claim(self, view: DevicesView, me: str, winner: str | None) -> bool:
        if winner == me:
            return False
        live = {d.peer_id for d in view.devices if not d.deleted and APP in d.apps}
        if not live - {me}:
            return True  # no other live row carries apps.bao
        if winner is None or winner not in live:
            return True  # nobody holds the role: someone must, or the agent never answers
        recorded = self._recorded_winner
        # The winner we last saw is gone (pruned or removed): take over from it.
        return recorded is not None and recorded != me and recorded not in live

    async def _read(self) -> DevicesView:
        view = await self.client.devices()
        if view is None:
            raise ServerUnavailable("GET /v1/devices answered 404")
        return view

    async def _register(self) -> None:
        await self.client.register(APP, self.version, name=self.name, os=self.os_name)

    # state changes

    def _set(self, verdict: Verdict) -> None:
        before = self._verdict
        if verdict == before:
            return
        self._verdict = verdict
        log.info(
            "election: this device is now %s (was %s; winner %s)",
            verdict,
            before,
            self.winner or "none",
        )

    def _disable(self, reason: str) -> None:
        self.enabled = False
        self.disabled_reason = reason
        log.warning(
            "election disabled for this run: %s; this device acts as the only one (always active)",
            reason,
        )

    def _read_failed(self, exc: Exception) -> None:
        text = f"{exc.__class__.__name__}: {exc}"
        if self._failing is None:
            log.warning("devices registry read failed (%s); keeping verdict %s", text, self.verdict)
            self._failing_since = self.clock.now()
        self._failing = text


__all__ = ["APP", "AlwaysActive", "Election", "Gate", "Verdict"]
