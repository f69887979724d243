"""Benchmark the schedule arithmetic: re-arming, parsing plus arming, and APScheduler 3 for scale.

Run: python bench/bench_schedule.py [--json out.json] [--defs 100000]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from anyrtd.model import TriggerDef, parse_record
from anyrtd.schedule import compile_schedule, once_due
from anyrtd.schedule.specs import _compile_cron

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
EXPRS = [
    "0 8 * * *",
    "*/5 * * * *",
    "30 9 * * mon-fri",
    "0 0 1 * *",
    "15,45 */2 * * *",
    "0 22-2 * * *",
    "0 12 * * 5#3",
    "0 0 L * *",
    "0 0 29 2 *",
    "0 9 1-7 * mon",
]
ZONES = [None, "Europe/Berlin", "America/New_York"]


def best_of(runs: int, fn: Callable[[], float]) -> tuple[float, float]:
    """Return (best, median) of several runs of a timing function."""
    samples = [fn() for _ in range(runs)]
    return min(samples), statistics.median(samples)


def rearm_us(expr: str, tz: str | None, n: int = 20000) -> float:
    """Average microseconds for next_after on an already compiled cron, over moving times."""
    spec: dict[str, Any] = {"cron": expr}
    if tz:
        spec["tz"] = tz
    schedule = compile_schedule("cron", spec)
    times = [NOW + i * 997.0 for i in range(n)]
    gc.disable()
    began = time.perf_counter()
    for t in times:
        schedule.next_after(t, 0.0)
    elapsed = time.perf_counter() - began
    gc.enable()
    return elapsed / n * 1e6


def croniter_us(expr: str, tz: str | None, n: int = 3000) -> float:
    """Average microseconds for croniter.get_next from a start time, for comparison."""
    from croniter import croniter

    zone = ZoneInfo(tz) if tz else UTC
    it = croniter(expr, datetime.fromtimestamp(NOW, zone))
    starts = [datetime.fromtimestamp(NOW + i * 997.0, zone) for i in range(n)]
    began = time.perf_counter()
    for s in starts:
        it.get_next(float, start_time=s)
    return (time.perf_counter() - began) / n * 1e6


def apscheduler_us(expr: str, tz: str | None, n: int = 3000) -> float | None:
    """Average µs for APScheduler 3's CronTrigger.get_next_fire_time; None if unsupported."""
    from apscheduler.triggers.cron import CronTrigger

    zone = ZoneInfo(tz) if tz else UTC
    try:
        trigger = CronTrigger.from_crontab(expr, timezone=zone)
    except ValueError:  # APScheduler 3 has no wrapping ranges, `L` or `#` in crontab syntax
        return None
    starts = [datetime.fromtimestamp(NOW + i * 997.0, zone) for i in range(n)]
    began = time.perf_counter()
    for s in starts:
        trigger.get_next_fire_time(None, s)
    return (time.perf_counter() - began) / n * 1e6


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def mixed_records(n: int, distinct: bool, seed: int = 7) -> list[dict[str, Any]]:
    """Build n records: 60% cron (a third of them zoned), 20% every_s, 15% once, 5% event."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        roll = rng.random()
        record: dict[str, Any] = {
            "id": f"t-{i}",
            "program": "agent:remind@v1",
            "args": {"space": "bao", "chatId": f"c{i % 50}", "text": "hello"},
            "owner": "",
            "enabled": True,
            "_v": i,
        }
        if roll < 0.6:
            expr = (
                f"{rng.randrange(60)} {rng.randrange(24)} * * {rng.choice(['*', 'mon-fri', '1,3'])}"
                if distinct
                else rng.choice(EXPRS)
            )
            spec: dict[str, Any] = {"cron": expr}
            tz = rng.choice(ZONES)
            if tz:
                spec["tz"] = tz
            record.update(kind="cron", spec=spec)
        elif roll < 0.8:
            record.update(kind="cron", spec={"every_s": rng.choice([30, 60, 300, 3600])})
        elif roll < 0.95:
            record.update(kind="once", spec={"at": NOW + rng.randrange(-86400, 86400 * 30)})
        else:
            record.update(
                kind="event", spec={"dataset": "chat_messages", "objectId": f"chat-{i % 20}"}
            )
        out.append(record)
    return out


def arm(d: TriggerDef, now: float) -> float | None:
    """Arm a definition the way the daemon does: once by its due time, others forward."""
    if d.kind == "once":
        return once_due(getattr(d.schedule, "at", None), d.rollup.last_run_at)
    return d.schedule.next_after(now, now)


def parse_and_arm_s(records: list[dict[str, Any]]) -> float:
    """Seconds to parse and arm every record, starting from a cold expression cache."""
    _compile_cron.cache_clear()
    gc.collect()
    began = time.perf_counter()
    for record in records:
        d = parse_record(record)
        if isinstance(d, TriggerDef):
            arm(d, NOW)
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--defs", type=int, default=100_000, help="definitions to parse and arm")
    args = parser.parse_args(argv)

    rows: list[dict[str, Any]] = []
    for tz in ZONES:
        for expr in EXPRS:
            ours = best_of(3, lambda e=expr, z=tz: rearm_us(e, z))  # type: ignore[misc]
            rows.append(
                {
                    "expr": expr,
                    "tz": tz or "UTC",
                    "anyrtd_us": round(ours[0], 2),
                    "anyrtd_median_us": round(ours[1], 2),
                    "croniter_us": round(croniter_us(expr, tz), 2),
                    "apscheduler3_us": _round(apscheduler_us(expr, tz)),
                }
            )

    shared = mixed_records(args.defs, distinct=False)
    distinct = mixed_records(args.defs, distinct=True)
    parse_shared = best_of(3, lambda: parse_and_arm_s(shared))
    parse_distinct = best_of(3, lambda: parse_and_arm_s(distinct))

    result = {
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
        "rearm": rows,
        "rearm_mean_us": round(statistics.mean(r["anyrtd_us"] for r in rows), 2),
        "rearm_max_us": max(r["anyrtd_us"] for r in rows),
        "croniter_mean_us": round(statistics.mean(r["croniter_us"] for r in rows), 2),
        "apscheduler3_mean_us": round(
            statistics.mean(r["apscheduler3_us"] for r in rows if r["apscheduler3_us"]), 2
        ),
        "anyrtd_mean_us_where_apscheduler3_runs": round(
            statistics.mean(r["anyrtd_us"] for r in rows if r["apscheduler3_us"]), 2
        ),
        "parse_and_arm": {
            "definitions": args.defs,
            "shared_expressions_s": round(parse_shared[0], 3),
            "distinct_expressions_s": round(parse_distinct[0], 3),
        },
    }

    print(f"{'expression':<20} {'tz':<17} {'anyrtd µs':>10} {'croniter µs':>12} {'APS3 µs':>9}")
    for r in rows:
        aps = "n/a" if r["apscheduler3_us"] is None else f"{r['apscheduler3_us']:.2f}"
        print(
            f"{r['expr']:<20} {r['tz']:<17} {r['anyrtd_us']:>10.2f} {r['croniter_us']:>12.2f} "
            f"{aps:>9}"
        )
    print(
        f"{'mean':<38} {result['rearm_mean_us']:>10.2f} {result['croniter_mean_us']:>12.2f} "
        f"{result['apscheduler3_mean_us']:>9.2f}"
    )
    print(f"{'mean where APS3 runs':<38} {result['anyrtd_mean_us_where_apscheduler3_runs']:>10.2f}")
    pa = result["parse_and_arm"]
    print(
        f"\nparse + arm {pa['definitions']:,} mixed definitions: "
        f"{pa['shared_expressions_s']:.2f} s (10 shared cron expressions), "
        f"{pa['distinct_expressions_s']:.2f} s (cron expressions mostly distinct)"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
