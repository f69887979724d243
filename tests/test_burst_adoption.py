"""A burst of new records reaches the registry at once, a slice of `TICK_CHANGES` per tick,
each tick following the last at once: not one slice per `tick_s`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from control_support import ServeProcess
from support import put_triggers, wait_until

from anyrtd.sync import TICK_CHANGES


def test_a_burst_of_records_is_adopted_in_back_to_back_ticks(
    devserver: Any, tmp_path: Path
) -> None:
    # A tick every 60 s: only the ticks that follow one another at once can adopt the
    # burst within the test's deadline.
    serve = ServeProcess(tmp_path, devserver.url, tick_s=60.0).start()
    try:
        n = 3 * TICK_CHANGES + 50
        # Pinned here: no claim is written back, whose echo would wake a tick of its own.
        fields = {"kind": "cron", "spec": {"every_s": 3600}, "program": "agent:x@v1"}
        records = {f"b{i:04d}": {**fields, "owner": devserver.peers[0]} for i in range(n)}
        put_triggers(devserver.url, records)

        def adopted() -> int:
            with serve.http() as client:
                listed = client.get("/triggers").json()
            return sum(1 for t in listed if t["id"] in records and t["adopted"])

        wait_until(lambda: adopted() == n, timeout=20, what=f"{n} records adopted")
    finally:
        serve.stop()
