"""The fault suite's misbehaving server (bench/faults/storm.py), once and short: behind a
proxy that answers 429 (`Retry-After: 5`) to everything while pinned `once` records come
due, then 200 with an HTML page and with truncated bodies, `anyrtd serve` loses no run
record, sets nothing aside, runs every `once` once (and the server holds it consumed),
blames none of the server's answers on a program, and says degraded while they last."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# `bench` is a folder of the repository, not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.faults.suite import run_family

pytestmark = pytest.mark.process


def test_a_429_storm_and_bad_answers_lose_no_write_and_blame_no_program(tmp_path: Path) -> None:
    result = run_family("storm", tmp_path, rounds=1)
    assert result.ok, result.report()
    assert result.figures["answers"]["429"] > 0 and result.figures["answers"]["html"] > 0
