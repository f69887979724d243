"""Schedule arithmetic: when a cron, every_s or once trigger fires next, without reading the clock.

Everything here is pure: times are unix seconds (floats) passed in, never read. A spec is
compiled once into a `Schedule`; arming is then `schedule.next_after(after, anchor)`.

Cron expressions are parsed and matched by a compiled matcher of our own (bit sets per field,
a forward search over months, days, hours, minutes and seconds) because croniter is too slow
to re-arm tens of thousands of definitions, gets DST fall-back wrong for our rules (it fires a
repeated local time twice) and its error messages do not say which field is wrong. The
accepted syntax and field meanings are croniter's (7.0), verified against croniter in the tests;
the few places where we deliberately differ are listed in docs/schedule.md.

- `parse`: cron text into a `CronExpr`, refusing what can never fire;
- `match`: the compiled expression's bit sets and the forward search;
- `zones`: IANA zone lookup and the cron(8) DST rules;
- `specs`: a trigger's spec compiled into a `Schedule`, and previews.
"""

from anyrtd.schedule.match import CronExpr
from anyrtd.schedule.parse import MAX_CRON_LENGTH, MAX_LIST_ITEMS, CronSyntaxError, parse_cron
from anyrtd.schedule.specs import (
    MAX_EVERY_S,
    MIN_EVERY_S,
    CronSchedule,
    EventSchedule,
    EverySchedule,
    InvalidSchedule,
    OnceSchedule,
    Schedule,
    compile_schedule,
    once_due,
    preview,
)
from anyrtd.schedule.zones import MAX_TZ_LENGTH

__all__ = [
    "MAX_CRON_LENGTH",
    "MAX_EVERY_S",
    "MAX_LIST_ITEMS",
    "MAX_TZ_LENGTH",
    "MIN_EVERY_S",
    "CronExpr",
    "CronSchedule",
    "CronSyntaxError",
    "EventSchedule",
    "EverySchedule",
    "InvalidSchedule",
    "OnceSchedule",
    "Schedule",
    "compile_schedule",
    "once_due",
    "parse_cron",
    "preview",
]
