"""The systemd notify protocol (sd_notify): readiness, status, reload, stop and watchdog pings.

A raw AF_UNIX datagram socket rather than the `sdnotify` package: the package swallows
every error without a word and cannot send the newer `MONOTONIC_USEC=` field, while
this module must say once, in the log, that the socket went away, and must never block
the event loop. Without `NOTIFY_SOCKET` every call is a no-op that opens nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

from anyrtd.clock import Clock

log = logging.getLogger(__name__)

# Variables systemd sets for the main process only; children (command programs) get none of them.
NOTIFY_ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def child_environ(env: Mapping[str, str]) -> dict[str, str]:
    """Return a copy of `env` without the notify variables, for processes the daemon spawns."""
    return {k: v for k, v in env.items() if k not in NOTIFY_ENV_VARS}


def _socket_address(raw: str) -> str | None:
    """Return the address to send to, or None when `raw` names no socket this module speaks to."""
    if raw.startswith("@"):
        # An abstract-namespace socket: '@' stands for the leading NUL byte.
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    return None


def _watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """Return the seconds between pings (half of `WATCHDOG_USEC`), or None when not asked for."""
    usec_raw = env.get("WATCHDOG_USEC")
    if not usec_raw:
        return None
    watchdog_pid = env.get("WATCHDOG_PID")
    if watchdog_pid:
        try:
            if int(watchdog_pid) != pid:
                return None
        except ValueError:
            log.warning("WATCHDOG_PID=%r is not a process id; not sending pings", watchdog_pid)
            return None
    try:
        usec = int(usec_raw)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number of microseconds; not sending pings", usec_raw)
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000


class Notifier:
    """Send sd_notify messages to the service manager, silently and for free without one.

    `enabled` is true when `NOTIFY_SOCKET` names a socket. `watchdog_interval` is the
    number of seconds between `WATCHDOG=1` pings (half of `WATCHDOG_USEC`) when the
    manager asked this process for them, else None. No method ever raises: a socket
    that has gone away is logged once and the message is dropped.
    """

    def __init__(
        self,
        env: Mapping[str, str] = os.environ,
        pid: int | None = None,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        raw = env.get("NOTIFY_SOCKET", "")
        self._address = _socket_address(raw) if raw else None
        if raw and self._address is None:
            log.warning(
                "NOTIFY_SOCKET=%r is neither a path nor an abstract '@' name; "
                "not talking to the service manager",
                raw,
            )
        self.enabled = self._address is not None
        self.watchdog_interval = (
            _watchdog_interval(env, os.getpid() if pid is None else pid) if self.enabled else None
        )
        self._monotonic_ns = monotonic_ns
        self._sock: socket.socket | None = None
        self._last_status: str | None = None
        self._failing = False

    def ready(self, status: str | None = None) -> None:
        """Tell the manager start-up (or a reload) is complete, with an optional status line."""
        fields = ["READY=1"]
        if status is not None:
            fields.append(self._status_field(status))
        self._send(fields)

    def status(self, text: str) -> None:
        """Set the one-line status `systemctl status` shows; an unchanged line is not resent."""
        if self._address is None:
            return
        line = _one_line(text)
        if line == self._last_status:
            return
        self._send([self._status_field(line)])

    def stopping(self, status: str | None = None) -> None:
        """Tell the manager a graceful stop has begun."""
        fields = ["STOPPING=1"]
        if status is not None:
            fields.append(self._status_field(status))
        self._send(fields)

    def reloading(self, status: str | None = None) -> None:
        """Tell the manager a reload has begun; call `ready()` when it is done."""
        # MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) match this message to the
        # reload it asked for; older managers ignore the field.
        fields = ["RELOADING=1", f"MONOTONIC_USEC={self._monotonic_ns() // 1000}"]
        if status is not None:
            fields.append(self._status_field(status))
        self._send(fields)

    def watchdog(self) -> None:
        """Tell the manager this process is alive and making progress."""
        self._send(["WATCHDOG=1"])

    def close(self) -> None:
        """Close the socket; a later message opens it again."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _status_field(self, text: str) -> str:
        self._last_status = _one_line(text)
        return f"STATUS={self._last_status}"

    def _send(self, fields: list[str]) -> None:
        if self._address is None:
            return
        payload = "\n".join(fields).encode("utf-8", "replace")
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # A full receive queue must drop a message, not stall the event loop.
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            if not self._failing:
                self._failing = True
                log.warning(
                    "cannot notify the service manager at %s (%s); dropping notify messages "
                    "until it answers again",
                    self._address.replace("\0", "@"),
                    exc,
                )
            return
        if self._failing:
            self._failing = False
            log.info("the service manager's notify socket answers again")


def _one_line(text: str) -> str:
    return " ".join(text.split())


async def run_watchdog(
    notifier: Notifier,
    last_progress: Callable[[], float],
    stall_after: float,
    clock: Clock,
) -> None:
    """Ping the watchdog at its interval while `last_progress()` is recent; return if none wanted.

    `last_progress()` is the `clock.monotonic()` reading of the tick loop's last completed
    step. Once it is `stall_after` seconds old the pings stop, so systemd kills and restarts
    the service after `WatchdogSec=`; they resume if progress does.
    """
    interval = notifier.watchdog_interval
    if interval is None:
        return
    stalled = False
    while True:
        age = clock.monotonic() - last_progress()
        if age < stall_after:
            if stalled:
                stalled = False
                log.warning("the tick loop is making progress again; watchdog pings resume")
            notifier.watchdog()
        elif not stalled:
            stalled = True
            log.error(
                "the tick loop has made no progress for %.1f s; withholding watchdog pings "
                "so that the service manager restarts anyrtd",
                age,
            )
        await clock.sleep(interval)
