"""The fault suite's fleet (bench/faults/fleet.py, on bench/bench_fence.py's cluster), short:
three `anyrtd serve` on a replicated devserver 1 s behind, the role moved three times and
its holder cut off, then a holder stopped as the role leaves it; every unassigned `once`
runs exactly once across the devices."""

from __future__ import annotations

import sys
from pathlib import Path

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.suite import run_family


def test_three_daemons_with_delay_partition_and_moves_fire_every_once_exactly_once(
    tmp_path: Path,
) -> None:
    result = run_family("fleet", tmp_path, rounds=24)
    assert result.ok, result.report()
    assert result.figures["onces"] == 24
    # The holder stopped (its row stays, it sends no beat), the role moved away: the new
    # holder claims once a stopped device can no longer believe it holds the role (its
    # lease of 3 polls, a tick, the lag), not after takeover_hold_s (60 s: 63 s before).
    stopped = result.figures["stopped_holder"]
    assert stopped["fired_twice"] == stopped["never_fired"] == 0, stopped
    assert stopped["first_fire_after_move_s"] < 20.0, stopped
