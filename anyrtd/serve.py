"""`anyrtd serve` as a process: signals, systemd notification, the watchdog and reloads."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
from collections.abc import Callable

from anyrtd.client import ServerClient
from anyrtd.config import Config, ConfigError
from anyrtd.control.server import ControlServer, ControlStartError
from anyrtd.daemon import Daemon
from anyrtd.election import Election
from anyrtd.mirror import rebuild_if_lost
from anyrtd.mirror_guard import MirrorFault
from anyrtd.notify import Notifier, run_watchdog
from anyrtd.statedir import StateDirError, lock_state_dir

log = logging.getLogger("anyrtd.serve")


class StartError(Exception):
    """The daemon cannot start (or go on); the message says why and what to do.

    `exit_status` is what `anyrtd serve` exits with: 1, or `EXIT_BROKEN_STATE` (65) when
    the mirror is at fault and a restart would fail the same way.
    """

    def __init__(self, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.exit_status = exit_status

    @classmethod
    def of(cls, fault: MirrorFault) -> StartError:
        return cls(str(fault), fault.exit_status)


def settle_heap() -> None:
    """Collect start-up garbage once, then keep what start-up built out of full GC passes.

    The registry and record cache built at start live as long as the process; left in
    the collector's oldest generation, every full pass walks all of them and stalls
    the event loop (and the control API) for tens of milliseconds at 10,000 triggers.
    """
    gc.collect()
    gc.freeze()


def status_line(daemon: Daemon) -> str:
    """Return the one-line summary systemd shows: verdict, triggers, runs today, outbox, error."""
    parts = [
        daemon.gate.verdict,
        f"{len(daemon.registry)} triggers adopted",
        f"{daemon.runs_today} runs today",
        f"outbox {daemon.outbox_depth}",
    ]
    if daemon.stats.last_error:
        parts.append(f"last error: {daemon.stats.last_error}")
    return "; ".join(parts)


def watchdog_stall_after(tick_s: float, watchdog_interval: float | None) -> float:
    """Return how long the tick loop may make no progress before the watchdog pings stop."""
    # WatchdogSec= (twice the ping interval) is the operator's word on how long a stall may
    # last, but never less than three ticks: the gap a healthy loop may leave between two.
    watchdog_s = 2 * watchdog_interval if watchdog_interval else 0.0
    return max(3 * tick_s, watchdog_s)


NOFILE_WHEN_UNLIMITED = 65536
"""The soft open-file limit taken where the hard one is unlimited."""


def raise_nofile_limit() -> int:
    """Raise the soft limit on open files to the hard limit, as systemd-era daemons do;
    return the soft limit now in force.

    systemd starts services with a soft limit of 1,024 (for `select()`, which anyrtd does
    not use) and a hard limit far above it (`LimitNOFILE=`); the control API's connection
    cap is derived from what this returns (docs/service.md, File descriptors).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit (macOS) cannot be the soft one: take a large finite number.
    target = NOFILE_WHEN_UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft
    log.debug("open-file limit raised from %d to %d", soft, target)
    return target


async def start_daemon(
    config: Config, hurry: asyncio.Event | None = None
) -> tuple[Daemon, ControlServer]:
    """Open the mirror, listen on the control API and run the first reconcile. `hurry`: the
    event a second stop signal sets (the daemon makes its own when none is given).

    Raise `StartError` (with what to do) when the mirror cannot be used (lost, damaged,
    unwritable, its schema not at head) or the control API cannot listen; what was started
    is stopped again.
    """
    raise_nofile_limit()
    client = ServerClient(config.server)
    gate = Election(client, poll_s=config.election_poll_s)
    daemon = Daemon(config, client=client, gate=gate, hurry=hurry)
    try:
        await daemon.open()
    except MirrorFault as exc:
        if daemon.db is not None:
            await daemon.db.close()
        await client.aclose()
        raise StartError.of(exc) from None
    control = ControlServer(daemon.port, config.listen, config.token_file)
    try:
        await control.start()
    except ControlStartError as exc:
        await daemon.stop()
        raise StartError(str(exc)) from None
    try:
        await daemon.start()
    except MirrorFault as exc:
        await control.stop()
        with contextlib.suppress(MirrorFault):
            await daemon.stop()
        raise StartError.of(exc) from None
    except BaseException:
        await control.stop()
        await daemon.stop()
        raise
    settle_heap()
    return daemon, control


def on_stop_signals(
    loop: asyncio.AbstractEventLoop, stop: asyncio.Event, hurry: asyncio.Event
) -> None:
    """Set `stop` on SIGTERM or SIGINT, and `hurry` on a second one (stop at once, runs in
    flight recorded `interrupted`), as a second Ctrl-C does in most programs."""

    def on_signal() -> None:
        if stop.is_set() and not hurry.is_set():
            log.warning("a second stop signal: interrupting the runs in flight now")
            hurry.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)


async def serve(
    config: Config,
    *,
    reload: Callable[[], Config] | None = None,
    notifier: Notifier | None = None,
    rebuild_mirror: bool = False,
) -> None:
    """Run the daemon until SIGTERM or SIGINT; reload the config on SIGHUP.

    With `rebuild_mirror`, a mirror that is lost, damaged or not anyrtd's is moved aside
    first and a new one made. Raise `StartError` when the daemon cannot start, or when its
    mirror fails under it (deleted, replaced, damaged): it stops then, before writing more.
    """
    try:
        lock_state_dir(config.state_dir)  # before anything is opened: one daemon per mirror
    except StateDirError as exc:
        raise StartError(str(exc)) from None
    if rebuild_mirror:
        try:
            await asyncio.to_thread(rebuild_if_lost, config.mirror_path)
        except MirrorFault as exc:
            raise StartError.of(exc) from None
    notifier = notifier or Notifier()
    daemon, control = await start_daemon(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    on_stop_signals(loop, stop, daemon.hurry)
    if reload is not None:
        loop.add_signal_handler(signal.SIGHUP, lambda: _reload(daemon, notifier, reload))
    notifier.ready(status_line(daemon))
    log.info("anyrtd is serving (peer %s)", daemon.peer_id or "unknown")
    helpers = [
        asyncio.create_task(
            run_watchdog(
                notifier,
                lambda: daemon.last_tick_mono or 0.0,
                stall_after=watchdog_stall_after(config.tick_s, notifier.watchdog_interval),
                clock=daemon.clock,
            )
        ),
        asyncio.create_task(_status_loop(daemon, notifier)),
    ]
    fault = await _until_stopped(stop, daemon)
    notifier.stopping("stopping: letting in-flight runs finish")
    log.info("stopping")
    for task in helpers:
        task.cancel()
    for task in helpers:
        # The status loop reads the mirror: it may have been the one to meet the fault.
        with contextlib.suppress(asyncio.CancelledError, MirrorFault):
            await task
    await control.stop()
    if fault is None:
        await daemon.stop()
        log.info("stopped")
        return
    with contextlib.suppress(MirrorFault):
        await daemon.stop()  # its last commit fails on the same fault: nothing more is written
    raise StartError.of(fault)


async def _until_stopped(stop: asyncio.Event, daemon: Daemon) -> MirrorFault | None:
    """Wait for a stop signal or a mirror fault; return the fault, if that came first."""
    assert daemon.db is not None
    faulted = daemon.db.faulted
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(faulted.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    return daemon.db.fault if not stop.is_set() else None


async def _status_loop(daemon: Daemon, notifier: Notifier) -> None:
    while True:
        # Today's runs are counted only for a status line someone reads (systemd's): the
        # count is a query over the day's runs, a quarter of an idle daemon's CPU.
        await daemon.refresh_summary(runs=notifier.enabled)
        notifier.status(status_line(daemon))
        await asyncio.sleep(max(1.0, daemon.config.tick_s))


def _reload(daemon: Daemon, notifier: Notifier, reload: Callable[[], Config]) -> None:
    notifier.reloading("reloading the configuration")
    try:
        new = reload()
    except ConfigError as exc:
        daemon.refuse_config(exc)
        log.error("reload refused, keeping the running configuration: %s", exc)
        notifier.ready(status_line(daemon))
        return
    daemon.apply_config(new)
    log.info("configuration reloaded from %s", new.source or "defaults")
    notifier.ready(status_line(daemon))
