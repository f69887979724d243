"""Programs shipped with anyrtd: the built-ins a trigger can name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from anyrtd.programs import remind, rollup
from anyrtd.programs.chat import InvalidArgs

if TYPE_CHECKING:
    from anyrtd.program import ProgramFn

BUILTINS: Mapping[str, ProgramFn] = MappingProxyType(
    {
        remind.SPEC: remind.main,
        rollup.SPEC: rollup.main,
    }
)
"""The built-in programs by spec; the runner looks here first."""

IDEMPOTENT: frozenset[str] = frozenset({remind.SPEC, rollup.SPEC})
"""The built-ins whose effects are idempotent by the run id (each writes its chat message
under an id derived from the run id, so a second attempt rewrites the same message): a run
of one that a crash left ambiguous is run again with the same run id (docs/reliability.md)."""

ARG_CHECKS: Mapping[str, Callable[[Mapping[str, Any]], object]] = MappingProxyType(
    {
        remind.SPEC: remind.check_args,
        rollup.SPEC: rollup.check_args,
    }
)
"""Each built-in's check of its args, the one its run starts with: raises InvalidArgs."""


def args_problem(program: str, args: Mapping[str, Any]) -> str | None:
    """Return why a built-in's args would fail every run of it, or None (also for a program
    that is not a built-in: its args are its own business)."""
    check = ARG_CHECKS.get(program)
    if check is None:
        return None
    try:
        check(args)
    except InvalidArgs as exc:
        return str(exc)
    return None


__all__ = ["ARG_CHECKS", "BUILTINS", "IDEMPOTENT", "InvalidArgs", "args_problem"]
