"""The cyclic garbage collector, paused over a stretch of work that builds many objects.

Opening a mirror of 100,000 triggers builds about a million objects that live as long as
the process. With the collector on, its full pass runs several times over that growing
heap while they are built: about a fifth of the start-up's CPU at 100,000 triggers. Paused,
it looks at them once the stretch ends, and `anyrtd serve` then keeps what start-up built
out of its passes (`serve.settle_heap`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


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
