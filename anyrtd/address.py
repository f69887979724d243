"""Where the control API listens (`HOST:PORT` or `unix:/path`) and the bearer token file."""

from __future__ import annotations

import ipaddress
import stat
from dataclasses import dataclass
from pathlib import Path

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})


class AddressError(ValueError):
    """A listen address or token file that cannot be used; the message says what to do."""


@dataclass(frozen=True)
class TcpAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self}"


@dataclass(frozen=True)
class UnixAddress:
    path: Path

    def __str__(self) -> str:
        return f"unix:{self.path}"

    @property
    def url(self) -> str:
        return "http://localhost"


Address = TcpAddress | UnixAddress


def parse_listen(listen: str) -> Address:
    """Parse `HOST:PORT`, `[v6]:PORT` or `unix:/path` into an address."""
    text = listen.strip()
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path:
            raise AddressError(
                f"listen address {listen!r}: give a socket path, e.g. unix:/run/anyrtd/control.sock"
            )
        return UnixAddress(Path(path).expanduser())
    if "://" in text:
        raise AddressError(
            f"listen address {listen!r}: give HOST:PORT without a scheme (127.0.0.1:7010) "
            "or unix:/path"
        )
    host, sep, port_text = text.rpartition(":")
    if not sep or not (port_text.isascii() and port_text.isdigit()):
        raise AddressError(
            f"listen address {listen!r}: expected HOST:PORT (127.0.0.1:7010) or unix:/path"
        )
    port = int(port_text)
    if port > 65535:
        raise AddressError(f"listen address {listen!r}: port {port} is out of range 0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise AddressError(f"listen address {listen!r}: name the host, e.g. 127.0.0.1:{port}")
    if "/" in host or any(c.isspace() for c in host):
        raise AddressError(
            f"listen address {listen!r}: {host!r} is not a host name or address; "
            "expected HOST:PORT (127.0.0.1:7010) or unix:/path"
        )
    return TcpAddress(host, port)


def is_loopback_host(host: str) -> bool:
    """Return True for a name or literal address that can only mean this machine."""
    name = host.lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def split_host_header(value: str) -> str:
    """Return the host part of a `Host` header value (without the port)."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        return value[: end + 1] if end != -1 else value
    host, sep, port = value.rpartition(":")
    if sep and port.isascii() and port.isdigit() and ":" not in host:
        return host
    return value


def read_token(path: Path, *, check_mode: bool) -> str:
    """Read the bearer token from `path`; with `check_mode`, refuse a group/world-readable file."""
    try:
        info = path.stat()
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AddressError(
            f"token file {path}: not found; create it (e.g. `head -c 32 /dev/urandom | base64 > "
            f"{path} && chmod 600 {path}`) or drop token_file from the config"
        ) from None
    except OSError as exc:
        raise AddressError(f"token file {path}: cannot be read ({exc.strerror})") from None
    if check_mode and stat.S_IMODE(info.st_mode) & 0o077:
        mode = oct(stat.S_IMODE(info.st_mode))[2:]
        raise AddressError(
            f"token file {path} is readable by group or others (mode {mode}): "
            f"run `chmod 600 {path}`"
        )
    token = text.strip()
    if not token or any(c.isspace() for c in token):
        raise AddressError(f"token file {path}: must hold one token on one line, with no spaces")
    return token
