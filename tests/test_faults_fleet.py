"""The fault suite's fleet (bench/faults/fleet.py, on bench/bench_fence.py's cluster), short:
three `anyrtd serve` on a replicated devserver 1 s behind, the role moved three times and
its holder cut off; every unassigned `once` runs exactly once across the devices."""

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
