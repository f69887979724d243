"""Opaque ids derived from the store's random salt, so they are stable for one `--db`."""

from __future__ import annotations

import base64
import hashlib

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
PEER_PREFIX = "12D3KooW"
PEER_TAIL = 44


def _digest(salt: str, *parts: str) -> bytes:
    h = hashlib.sha512()
    h.update(salt.encode())
    for part in parts:
        # A separator that cannot occur in a length-prefixed field keeps (a, bc) apart from (ab, c).
        h.update(f"\0{len(part)}:".encode())
        h.update(part.encode())
    return h.digest()


def base58(data: bytes) -> str:
    """Encode `data` in the bitcoin base58 alphabet (what libp2p peer ids use)."""
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, rem = divmod(n, 58)
        out.append(_B58[rem])
    pad = len(data) - len(data.lstrip(b"\0"))
    return "1" * pad + "".join(reversed(out))


def peer_id(salt: str, device: int, generation: int) -> str:
    """Return the peer id of devserver device `device` after `generation` fresh inits."""
    tail = base58(_digest(salt, "peer", str(device), str(generation)))
    return PEER_PREFIX + tail[:PEER_TAIL]


def type_id(salt: str, space: str, key: str) -> str:
    """Return the id of the type `key` in `space`."""
    return "t_" + _digest(salt, "type", space, key).hex()[:12]


def object_id(salt: str, space: str, bundle: str, seed: str) -> str:
    """Return the id of the bundle child `seed`, shaped like the server's CIDs (`bafyrei...`)."""
    raw = _digest(salt, "object", space, bundle, seed)[:32]
    return "bafyrei" + base64.b32encode(raw).decode().lower().rstrip("=")[:52]


def is_peer_id(value: str) -> bool:
    """Tell whether `value` has the shape of a peer id."""
    tail = value[len(PEER_PREFIX) :]
    return value.startswith(PEER_PREFIX) and len(tail) == PEER_TAIL and all(c in _B58 for c in tail)
