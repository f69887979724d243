"""The package reads as the flow: no module imports one that comes later in it, and no import
circles (docs/architecture.md lists the modules in this order)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import anyrtd

PACKAGE = Path(anyrtd.__file__).parent

FLOW: tuple[tuple[str, ...], ...] = (
    # the words and the tools every room uses
    (
        "anyrtd",
        "anyrtd.vocab",
        "anyrtd.escape",
        "anyrtd.clock",
        "anyrtd.heap",
        "anyrtd.logs",
        "anyrtd.metrics",
        "anyrtd.notify",
    ),
    ("anyrtd.address",),
    ("anyrtd.config",),
    # records on the server ─▶ client ─▶ record cache + mirror ─▶ reconcile ─▶ registry
    ("anyrtd.client",),
    ("anyrtd.places",),
    ("anyrtd.schedule",),
    ("anyrtd.model",),
    ("anyrtd.records",),
    ("anyrtd.rows",),
    ("anyrtd.mirror_guard",),
    ("anyrtd.mirror",),
    ("anyrtd.migrations",),  # the top-level migrations/, linked into the package
    ("anyrtd.claims",),
    ("anyrtd.reconcile",),
    ("anyrtd.registry",),
    # ─▶ runner (programs) ─▶ outbox
    ("anyrtd.program",),
    ("anyrtd.programs",),
    ("anyrtd.runs",),
    ("anyrtd.runner",),
    ("anyrtd.outbox",),
    # many devices: the verdict, the standing built-ins, event triggers
    ("anyrtd.election",),
    ("anyrtd.standing",),
    ("anyrtd.events",),
    # the daemon's stages, in the order of one step
    ("anyrtd.unit",),
    ("anyrtd.sync",),
    ("anyrtd.apply",),
    ("anyrtd.firing",),
    ("anyrtd.timer",),
    ("anyrtd.history",),
    ("anyrtd.missed",),
    ("anyrtd.watch",),
    ("anyrtd.why",),
    # the port its readers use, the chat responder, and the active role
    ("anyrtd.port",),
    ("anyrtd.chat",),
    ("anyrtd.role",),
    ("anyrtd.why_facts",),
    ("anyrtd.notices",),
    # the wiring, the control API, the process
    ("anyrtd.daemon",),
    ("anyrtd.control.guard",),
    ("anyrtd.control.gate",),
    ("anyrtd.control.page",),
    ("anyrtd.control.openapi",),
    ("anyrtd.control.views",),
    ("anyrtd.control.api",),
    ("anyrtd.control.server",),
    ("anyrtd.statedir",),
    ("anyrtd.serve",),
    ("anyrtd.devserver",),
    # the command line (the only place that prints)
    (
        "anyrtd.control",
        "anyrtd.control.writes",
        "anyrtd.service_files",
        "anyrtd.dev",
        "anyrtd.cli",
        "anyrtd.__main__",
    ),
)
"""Each row is a room; a module may import its own room's modules and those of earlier rows."""

PACKAGES = (
    "anyrtd.migrations",
    "anyrtd.programs",
    "anyrtd.devserver",
    "anyrtd.schedule",
    "anyrtd.runner",
    "anyrtd.cli",
)
"""Names in FLOW that also cover their subpackage's modules (`anyrtd.programs.chat`)."""

COMMAND_LINE = FLOW[-1]


def module_names() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


MODULES = dict(module_names())


def imports_of(name: str, path: Path) -> set[str]:
    """Return the anyrtd modules `name` imports (at any depth of its code)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            # `from package import module` imports the module, not the package's own names.
            submodules = {f"{target}.{a.name}" for a in node.names} & MODULES.keys()
            out.update(submodules)
            if len(submodules) < len(node.names):
                out.add(target)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def rank(name: str) -> int:
    """Return the row of FLOW that holds `name`, or its package's row."""
    for i, room in enumerate(FLOW):
        if name in room:
            return i
    package = next((p for p in PACKAGES if name.startswith(p + ".")), None)
    if package is None:
        raise AssertionError(f"{name} has no place in FLOW: add it to the room it belongs to")
    return rank(package)


def test_every_module_has_a_place_in_the_flow() -> None:
    for name in MODULES:
        rank(name)


def test_no_module_imports_one_later_in_the_flow() -> None:
    upward = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        for target in targets
        if rank(target) > rank(name)
    )
    assert upward == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return one cycle through each strongly connected group of two or more modules."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_circles_outside_the_command_line() -> None:
    graph = {
        name: {t for t in targets if not (name in COMMAND_LINE and t in COMMAND_LINE)}
        for name, targets in GRAPH.items()
    }
    assert cycles(graph) == []


def test_no_import_circles_in_the_command_line() -> None:
    assert cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_daemon_module_stays_a_wiring_module() -> None:
    lines = (PACKAGE / "daemon.py").read_text().count("\n")
    assert lines < 500, f"daemon.py has {lines} lines: move a stage's work into its module"
