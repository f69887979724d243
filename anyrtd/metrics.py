"""Counters and histograms the daemon keeps for `GET /metrics`."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
TICK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


@dataclass
class Histogram:
    """A cumulative-bucket histogram in the Prometheus sense."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0
    recent: list[float] = field(default_factory=list)
    keep: int = 4096

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1
        self.recent.append(value)
        if len(self.recent) > self.keep:
            del self.recent[: len(self.recent) - self.keep]

    def cumulative(self) -> list[tuple[str, int]]:
        """Return (le, count) pairs, `+Inf` last."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            out.append((repr(bound), running))
        out.append(("+Inf", self.n))
        return out


@dataclass
class Stats:
    fires: int = 0
    overlap_skips: int = 0
    overlap_by_trigger: Counter[str] = field(default_factory=Counter)
    """Overlap skips by trigger id (a trigger's `why` shows its count)."""
    missed_skips: int = 0
    """Cron occurrences found too late to fire (the daemon was stopped): missed ones."""
    ticks: int = 0
    malformed_skips: int = 0
    runs_finished: Counter[str] = field(default_factory=Counter)
    fire_lag: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))
    tick_duration: Histogram = field(default_factory=lambda: Histogram(TICK_BUCKETS))
    last_error: str | None = None
