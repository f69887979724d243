"""The families in the order the long mode runs them, and the one way to run one."""

from __future__ import annotations

import importlib
import time
import traceback
from pathlib import Path
from types import ModuleType

from bench.faults.common import Result, load

# name -> module under bench.faults; each has ROUNDS, QUICK, UNIT and run(work, rounds)
FAMILIES = {
    "kill9": "killnine",
    "outage": "outage",
    "diskfull": "diskfull",
    "clock": "clock",
    "records": "records",
    "flood": "flood",
    "programs": "hostile",
    "fleet": "fleet",
    "storm": "storm",
    "startwin": "startwin",
}


def family(name: str) -> ModuleType:
    if name not in FAMILIES:
        raise SystemExit(f"no fault family {name!r}; choose from {', '.join(FAMILIES)}")
    return importlib.import_module(f"bench.faults.{FAMILIES[name]}")


def run_family(name: str, work: Path, rounds: int | None = None, quick: bool = False) -> Result:
    """Run one family in `work`; a crash of the harness is a result with `error`, not a raise."""
    module = family(name)
    n = rounds if rounds is not None else (module.QUICK if quick else module.ROUNDS)
    work.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    load_before = load()
    try:
        result: Result = module.run(work, n)
    except Exception as exc:
        result = Result(name)
        result.error = f"{type(exc).__name__}: {exc}"
        result.notes.append(traceback.format_exc(limit=6))
    result.family = name
    result.seconds = time.monotonic() - began
    result.figures.setdefault("rounds", n)
    result.figures["load_before"] = load_before
    result.figures["load_after"] = load()
    return result
