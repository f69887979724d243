"""A real `anyrtd serve` subprocess for the control API and CLI tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
from conftest import anyrtd_command
from support import wait_until

TICK = 0.2
LISTENING = re.compile(r"control API listening on (\S+)")


class ServeProcess:
    """`anyrtd serve` on a devserver: `.listen` is the bound address, `.http()` a client of it."""

    def __init__(
        self,
        tmp: Path,
        server_url: str,
        *,
        listen: str | None = None,
        config_lines: tuple[str, ...] = (),
        name: str = "serve",
        grace_s: float = 1.0,
        tick_s: float = TICK,
    ) -> None:
        self.tmp = tmp
        self.server_url = server_url
        self.state = tmp / f"{name}-state"
        self.log = tmp / f"{name}.log"
        self.config = tmp / f"{name}.toml"
        self.requested = listen or f"unix:{tmp / f'{name}.sock'}"
        lines = (f"grace_s = {grace_s}", *config_lines)
        self.config.write_text("".join(f"{line}\n" for line in lines))
        self.listen = ""
        self.tick_s = tick_s
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            *anyrtd_command(),
            "serve",
            "--config",
            str(self.config),
            "--server",
            self.server_url,
            "--state-dir",
            str(self.state),
            "--tick",
            str(self.tick_s),
            "--listen",
            self.requested,
        ]

    def spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                self.argv(), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
        return self.proc

    def start(self) -> ServeProcess:
        """Start the daemon and wait until its control API reports a tick."""
        offset = self.log.stat().st_size if self.log.exists() else 0
        self.spawn()

        def bound() -> str | None:
            self._check_alive()
            match = LISTENING.search(self.log.read_text(errors="replace")[offset:])
            return match.group(1) if match else None

        self.listen = wait_until(bound, timeout=30, what="anyrtd serve to listen")
        wait_until(self._ticking, timeout=30, what="anyrtd serve to tick")
        return self

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"anyrtd serve exited {self.proc.returncode}:\n{self.log.read_text()}"
            )

    def _ticking(self) -> bool:
        self._check_alive()
        with self.http() as client:
            resp = client.get("/healthz")
        return resp.status_code == 200 and resp.json().get("status") in ("ok", "degraded")

    def http(self, **kwargs: Any) -> httpx.Client:
        """Return a client of the control API (over the unix socket or TCP)."""
        if self.listen.startswith("unix:"):
            transport = httpx.HTTPTransport(uds=self.listen[len("unix:") :])
            return httpx.Client(
                base_url="http://localhost", transport=transport, timeout=10, **kwargs
            )
        return httpx.Client(base_url=f"http://{self.listen}", timeout=10, **kwargs)

    def trigger(self, trigger_id: str) -> dict[str, Any]:
        """Return `GET /triggers/ID`: the daemon's view of one trigger."""
        with self.http() as c:
            resp = c.get(f"/triggers/{trigger_id}")
        assert resp.status_code == 200, resp.text
        body: dict[str, Any] = resp.json()
        return body

    def runs(self, trigger_id: str, limit: int = 100) -> list[dict[str, Any]]:
        """Return `GET /runs?trigger=ID`: this device's runs of one trigger, newest first."""
        with self.http() as c:
            resp = c.get("/runs", params={"trigger": trigger_id, "limit": str(limit)})
        assert resp.status_code == 200, resp.text
        found: list[dict[str, Any]] = resp.json()
        return found

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL past the timeout; return the exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.send_signal(signal.SIGCONT)  # a daemon a test stopped takes it too
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()
