"""The runner: resolve a program spec, run it under the budget, and report an honest outcome.

- `run`: the `Runner`, one run from start to `RunOutcome` (budget, interrupt, in-process
  programs and commands);
- `budget`: a run's budget, counted on the time the daemon was there to watch it (a
  stopped daemon does not blame its programs);
- `resolve`: which program a spec names on this device (built-ins, entry points, commands);
- `capture`: the run's output, kept up to the cap, and the result line;
- `process`: a command's process group, stopped whole.

What a program implements (`ProgramContext`, `ProgramFn`) and what a run reports
(`RunOutcome`) are in `anyrtd.program`; the result fields a program may report are in
`anyrtd.runs`.
"""

from anyrtd.runner.resolve import ENTRY_POINT_GROUP, Program
from anyrtd.runner.run import Launch, Runner

__all__ = ["ENTRY_POINT_GROUP", "Launch", "Program", "Runner"]
