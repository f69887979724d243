"""Program lookup: which program a spec names on this device, or why there is none.

Programs come from three places, in order: the built-ins shipped with anyrtd (plus
in-process ones the daemon adds), the `anyrtd.programs` entry-point group, and the command
table of the local config. A spec is only ever a lookup key: a synced record cannot make a
device run anything that is not installed or declared on that device.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from anyrtd.config import CommandProgram
from anyrtd.program import ProgramFn
from anyrtd.runs import one_line

log = logging.getLogger("anyrtd.runner")

ENTRY_POINT_GROUP = "anyrtd.programs"


@dataclass(frozen=True)
class Program:
    """A resolved program: an in-process `main` or a declared command."""

    spec: str
    source: Literal["builtin", "entry_point", "command"]
    origin: str
    main: ProgramFn | None = None
    command: CommandProgram | None = None
    idempotent: bool = False
    """An in-process program whose effects are idempotent by the run id: a run a crash left
    ambiguous is run again with the same run id (declared by its registration: a built-in's
    in `anyrtd.programs.IDEMPOTENT` or `install`, an entry point's by `main.idempotent =
    True`)."""


class ProgramTable:
    """The programs installed here: built-ins, entry points and declared commands, by spec."""

    def __init__(
        self,
        builtins: Mapping[str, ProgramFn],
        commands: Mapping[str, CommandProgram],
        idempotent: Iterable[str] = (),
    ) -> None:
        self._builtins = dict(builtins)
        self._idempotent = set(idempotent)
        self._commands = dict(commands)
        self._entry_points: dict[str, importlib.metadata.EntryPoint] | None = None
        self._resolved: dict[str, Program] = {}
        self._load_errors: dict[str, str] = {}

    def set_commands(self, commands: Mapping[str, CommandProgram]) -> None:
        """Take a reloaded command table."""
        self._commands = dict(commands)
        self._resolved = {k: p for k, p in self._resolved.items() if p.source != "command"}

    def resolve(self, spec: str) -> Program | None:
        """Return the program installed here under `spec`, or None."""
        found = self._resolved.get(spec)
        if found is not None:
            return found
        fn = self._builtins.get(spec)
        if fn is not None:
            origin = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
            found = Program(spec, "builtin", origin, main=fn, idempotent=spec in self._idempotent)
        elif (ep := self._entry_point(spec)) is not None:
            found = self._load_entry_point(spec, ep)
        # A broken entry point does not hide a command the local config declares.
        if found is None and (cmd := self._commands.get(spec)) is not None:
            found = Program(spec, "command", cmd.argv[0], command=cmd)
        if found is not None:
            self._resolved[spec] = found
        return found

    def install(self, spec: str, main: ProgramFn, *, idempotent: bool = False) -> None:
        """Add an in-process built-in unless one exists under `spec` (`idempotent`: its
        effects are idempotent by the run id)."""
        if spec not in self._builtins:
            self._builtins[spec] = main
            if idempotent:
                self._idempotent.add(spec)
            self._resolved.pop(spec, None)

    def rescan_entry_points(self) -> None:
        """Forget the entry-point index so newly installed packages are seen."""
        self._entry_points = None
        self._load_errors.clear()
        self._resolved = {k: p for k, p in self._resolved.items() if p.source != "entry_point"}

    def not_found(self, spec: str) -> str:
        """Return why `spec` names no usable program here, and where one could come from."""
        if spec in self._load_errors:
            return f"program {spec!r} is not usable on this device: {self._load_errors[spec]}"
        return (
            f"program {spec!r} is not installed on this device: it is not a built-in, no "
            f"package provides it in the entry-point group {ENTRY_POINT_GROUP!r}, and the local "
            f'config has no [programs."{spec}"] table'
        )

    def _entry_point(self, spec: str) -> importlib.metadata.EntryPoint | None:
        if self._entry_points is None:
            index: dict[str, importlib.metadata.EntryPoint] = {}
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                # The first distribution on sys.path wins, as for console scripts.
                index.setdefault(ep.name, ep)
            self._entry_points = index
        return self._entry_points.get(spec)

    def _load_entry_point(self, spec: str, ep: importlib.metadata.EntryPoint) -> Program | None:
        if spec in self._load_errors:
            return None
        try:
            main = ep.load()
        except Exception as exc:
            self._load_errors[spec] = (
                f"its entry point {ep.value} (group {ENTRY_POINT_GROUP}) failed to load: "
                f"{type(exc).__name__}: {one_line(str(exc), 'no message')}"
            )
            log.warning("program %s: %s", spec, self._load_errors[spec])
            return None
        if not callable(main):
            self._load_errors[spec] = (
                f"its entry point {ep.value} is a {type(main).__name__}, not an "
                f"async function main(args, ctx)"
            )
            log.warning("program %s: %s", spec, self._load_errors[spec])
            return None
        idempotent = getattr(main, "idempotent", False) is True
        return Program(spec, "entry_point", ep.value, main=main, idempotent=idempotent)
