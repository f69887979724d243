#!/usr/bin/env python3
"""An example anyrtd command program: report how full a filesystem is, fail past a threshold.

anyrtd runs it with the trigger's args as JSON on stdin, for example
{"path": "/", "warnPercent": 90}, and the run's context in ANYRTD_* variables.
Everything it prints is kept with the run; the last stdout line, a JSON object,
becomes the run's result (its title lands on the run record). A non-zero exit
status makes the run FAILED with errorType "ExitCode".
"""

import json
import os
import shutil
import sys


def main() -> int:
    raw = sys.stdin.read().strip()
    args = json.loads(raw) if raw else {}
    path = args.get("path", "/")
    warn = args.get("warnPercent", 90)
    if not isinstance(path, str) or not isinstance(warn, (int, float)) or not 0 < warn <= 100:
        print(
            f"bad args {args!r}: expected path (a string) and warnPercent (0-100]", file=sys.stderr
        )
        return 2
    try:
        usage = shutil.disk_usage(path)
    except OSError as exc:
        print(f"cannot read {path}: {exc.strerror}", file=sys.stderr)
        return 1
    used = 100.0 * usage.used / usage.total if usage.total else 0.0
    print(f"run {os.environ.get('ANYRTD_RUN_ID', '?')} on {os.environ.get('ANYRTD_DEVICE', '?')}")
    print(
        f"{path}: {used:.1f}% used, {usage.free / 2**30:.1f} GiB free of "
        f"{usage.total / 2**30:.1f} GiB"
    )
    full = used >= warn
    if full:
        print(f"{path} is above {warn}% full", file=sys.stderr)
    print(json.dumps({"title": f"{path} {used:.0f}% full", "effects": 0}))
    return 1 if full else 0


if __name__ == "__main__":
    sys.exit(main())
