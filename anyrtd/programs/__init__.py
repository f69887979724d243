"""Programs shipped with anyrtd: the built-ins a trigger can name."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

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

__all__ = ["BUILTINS", "InvalidArgs"]
