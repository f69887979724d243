"""Render the long mode's JSON as the Markdown tables of docs/reliability.md.

    python -m bench.faults.render faults.json [more.json ...]

Each file is one `python -m bench.faults --json` run; the families of all of them are
listed in the suite's order, each with its date, commit, load and duration.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.faults.suite import FAMILIES


def render(reports: list[dict[str, Any]]) -> str:
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for report in reports:
        for fam in report["families"]:
            found[fam["family"]] = (report, fam)
    out: list[str] = []
    for name in FAMILIES:
        if name not in found:
            continue
        report, fam = found[name]
        figures = fam["figures"]
        head = (
            f"**{name}**: {figures.get('rounds')} rounds, {fam['seconds']:.0f} s, "
            f"{report['date']}, commit {report['commit']}, "
            f"load {figures.get('load_before')} → {figures.get('load_after')}"
        )
        out += [head, ""]
        if fam["skipped"]:
            out += [f"skipped: {fam['skipped']}", ""]
            continue
        if fam["error"]:
            out += [f"harness error: {fam['error']}", ""]
        out += ["| promise | figure | expected | |", "| --- | ---: | --- | --- |"]
        for check in fam["checks"]:
            verdict = "ok" if check["ok"] else "**FAIL**"
            out.append(f"| {check['name']} | {check['value']} | {check['expect']} | {verdict} |")
        shown = ("rounds", "load_before", "load_after", "scenarios")
        rest = {k: v for k, v in figures.items() if k not in shown}
        out += ["", f"figures: `{json.dumps(rest, default=str)}`", ""]
        if figures.get("scenarios"):
            out += [
                "| delay (s) | onces | twice | never | cron twice | wait p50 (s) | wait max (s) |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            for sc in figures["scenarios"]:
                out.append(
                    f"| {sc['delay_s']:g} | {sc['onces']} | {sc['fired_twice']} | "
                    f"{sc['never_fired']} | {sc['cron_fired_twice']} | {sc['once_wait_p50_s']} | "
                    f"{sc['once_wait_max_s']} |"
                )
            out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render([json.loads(Path(p).read_text()) for p in sys.argv[1:]]))
