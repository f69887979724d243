"""A small client of the control API for the command line, over TCP or a unix socket.

httpx is imported when a client is made, not with this module, so that the commands
that never talk to the daemon do not pay for it.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anyrtd.address import TcpAddress, UnixAddress, parse_listen, read_token

if TYPE_CHECKING:
    import httpx


class ControlUnreachable(Exception):
    """The daemon's control API does not answer; the message says what to check."""


class ControlError(Exception):
    """The control API answered with an error body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class ControlClient:
    """Talk to a running daemon's control API."""

    def __init__(
        self,
        listen: str,
        *,
        token_file: Path | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        import httpx

        self.address: TcpAddress | UnixAddress = parse_listen(listen)
        headers = {"Accept": "application/json"}
        if token_file is not None and isinstance(self.address, TcpAddress):
            headers["Authorization"] = f"Bearer {read_token(token_file, check_mode=False)}"
        if transport is None and isinstance(self.address, UnixAddress):
            transport = httpx.HTTPTransport(uds=str(self.address.path))
        self._http = httpx.Client(
            base_url=self.address.url, transport=transport, timeout=timeout, headers=headers
        )
        self._timeout = timeout
        self._probed = False
        self.last_headers: Mapping[str, str] = {}
        """The headers of the last answer (`X-Anyrtd-Source` says where runs were read)."""

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        ok: tuple[int, ...] = (),
    ) -> Any:
        """Send a request; return the decoded JSON (or text) of a 2xx answer, else raise."""
        import httpx

        self._probe()
        try:
            if body is None:
                resp = self._http.request(method, path, params=params)
            else:
                resp = self._http.request(method, path, params=params, json=body)
        except httpx.TransportError as exc:
            raise self._unreachable(exc.__class__.__name__) from None
        self.last_headers = resp.headers
        if resp.status_code >= 400 and resp.status_code not in ok:
            code, message = "error", resp.text.strip() or resp.reason_phrase
            try:
                err = resp.json().get("error")
                if isinstance(err, dict):
                    code = str(err.get("code", code))
                    message = str(err.get("message", message))
            except (ValueError, AttributeError):
                pass
            raise ControlError(resp.status_code, code, message)
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.text

    def _unreachable(self, why: str) -> ControlUnreachable:
        return ControlUnreachable(
            f"cannot reach the daemon at {self.address} ({why}): is `anyrtd serve` running? "
            "(set --listen or ANYRTD_LISTEN if it listens elsewhere)"
        )

    def _probe(self) -> None:
        """Check once that something listens on the unix socket.

        httpcore leaks its socket when a unix-socket connect fails, so the failure is
        found here first, with a socket that is closed either way.
        """
        if self._probed or not isinstance(self.address, UnixAddress):
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(self._timeout)
            try:
                probe.connect(str(self.address.path))
            except OSError as exc:
                raise self._unreachable(exc.strerror or str(exc)) from None
        self._probed = True

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str) -> Any:
        return self.request("POST", path)

    def patch(self, path: str, body: Mapping[str, Any]) -> Any:
        return self.request("PATCH", path, body=dict(body))
