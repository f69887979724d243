"""The cyclic garbage collector, paused over a stretch of work that builds many objects.

Opening a mirror of 100,000 triggers builds about a million objects that live as long as
the process. With the collector on, its full pass runs several times over that growing
heap while they are built: about a fifth of the start-up's CPU at 100,000 triggers. Paused,
it looks at them once the stretch ends, and `anyrtd serve` then keeps what start-up built
out of its passes (`serve.settle_heap`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector until the block ends (nested: the outer one)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def keep_built() -> None:
    """Keep what was built so far out of the collector's full passes (as `anyrtd serve`
    does once start-up is done): the young generations collected, then all frozen. For
    stretches after start-up that build as much again (the definitions of 100,000 records,
    parsed after readiness), which full passes would walk again and again."""
    gc.collect(1)
    gc.freeze()


__all__ = ["gc_paused", "keep_built"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """Return glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def give_back() -> bool:
    """Hand the C heap's free memory back to the system; return whether it could be asked.

    After an answer refused at the response cap (up to 16 MB read, then let go of), the
    allocator keeps the freed room: 5 such answers left the process 22 MB larger until it
    ended, and this returns it (docs/service.md, "Memory"). A few milliseconds: only called
    after such an answer."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
