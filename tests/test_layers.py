"""The package reads as the flow: no module imports one that comes later in it, and no import
circles (docs/architecture.md lists the modules in this order); and the stages are wired at
construction: no callable is handed to an object after it is built, and no stage writes
another stage's attributes."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
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
    ("anyrtd.chain",),
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
    ("anyrtd.lifecycle",),
    ("anyrtd.sync",),
    ("anyrtd.apply",),
    ("anyrtd.firing",),
    ("anyrtd.timer",),
    ("anyrtd.history",),
    ("anyrtd.missed",),
    ("anyrtd.watch",),
    ("anyrtd.why",),
    ("anyrtd.agenda",),
    # the port its readers use, the chat responder, and the active role
    ("anyrtd.port",),
    ("anyrtd.chat",),
    ("anyrtd.chaining",),
    ("anyrtd.role",),
    ("anyrtd.why_facts",),
    ("anyrtd.notices",),
    ("anyrtd.daemon_port",),
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


# Stages wired at construction. An import graph shows only the arrows of imports: a callback
# assigned to another object's attribute after it is built (`registry.settle = self._settle`),
# or a stage writing another stage's attributes (`self.firing.stats.fires -= 1`), is an arrow
# no import shows. Each stage gets what it calls in its constructor instead.

STAGES = frozenset(
    {
        "Ahead",
        "Apply",
        "ChatWatch",
        "Daemon",
        "DaemonPort",
        "Fence",
        "Firing",
        "Gate",
        "Registry",
        "RecordCache",
        "Role",
        "Runner",
        "ServerClient",
        "Sync",
        "Timer",
        "Unit",
    }
)
"""The classes whose instances are the daemon's stages (and the daemon itself)."""


def _names_in(annotation: ast.expr | None) -> set[str]:
    """Return the class names an annotation mentions (`Sync | None` gives `Sync`)."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", annotation.value))
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}


def _is_property(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "property")
        or (isinstance(d, ast.Attribute) and d.attr in {"setter", "deleter"})
        for d in fn.decorator_list
    )


def _methods(trees: Iterable[ast.Module]) -> set[str]:
    """Return the names of the methods (not properties) that the package's classes define."""
    return {
        fn.name
        for tree in trees
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_property(fn)
    }


def _root(target: ast.expr) -> tuple[str, list[str]] | None:
    """Return the name an attribute target starts from and the attributes after it
    (`self.firing.stats.fires` gives `("self", ["firing", "stats", "fires"])`)."""
    attrs: list[str] = []
    node = target
    while isinstance(node, ast.Attribute):
        attrs.insert(0, node.attr)
        node = node.value
    if not attrs or not isinstance(node, ast.Name):
        return None
    return node.id, attrs


def _stage_fields(cls: ast.ClassDef) -> set[str]:
    """Return the attributes of `cls` that hold a stage: annotated with one (in the class
    body, or as the `__init__` parameter assigned to it), built from one, or a property
    that returns one."""
    fields: set[str] = set()
    for node in cls.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _names_in(node.annotation) & STAGES
        ):
            fields.add(node.target.id)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if _is_property(node) and _names_in(node.returns) & STAGES:
                fields.add(node.name)
            if node.name != "__init__":
                continue
            args = [*node.args.args, *node.args.kwonlyargs]
            staged = {a.arg for a in args if _names_in(a.annotation) & STAGES}
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign | ast.AnnAssign):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    value = stmt.value
                    built = value is not None and any(
                        (isinstance(n, ast.Name) and n.id in staged)
                        or (isinstance(n, ast.Call) and _names_in(n.func) & STAGES)
                        for n in ast.walk(value)
                    )
                    noted = isinstance(stmt, ast.AnnAssign) and _names_in(stmt.annotation) & STAGES
                    for t in targets:
                        root = _root(t)
                        own = root is not None and root[0] == "self" and len(root[1]) == 1
                        if own and (built or noted):
                            assert root is not None
                            fields.add(root[1][0])
    return fields


def _fields(trees: Iterable[ast.Module]) -> set[str]:
    """Return the names of the data attributes the package's classes hold."""
    out: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                out.update(
                    n.target.id
                    for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                )
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                out.add(node.attr)
    return out


def _callable_value(
    value: ast.expr,
    cls: ast.ClassDef | None,
    fn: ast.AST | None,
    module: ast.Module,
    data: set[str],
) -> bool:
    """Return whether `value` is a lambda, a bound method or a function (not a call's result,
    nor a data attribute)."""
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.IfExp):
        return any(_callable_value(v, cls, fn, module, data) for v in (value.body, value.orelse))
    if isinstance(value, ast.Attribute):
        if isinstance(value.value, ast.Name) and value.value.id == "self" and cls is not None:
            return value.attr in _methods([ast.Module(body=[cls], type_ignores=[])])
        return value.attr in _methods([module]) - data or value.attr in METHODS - data
    if isinstance(value, ast.Name):
        scopes: list[ast.AST] = [module, *([fn] if fn is not None else [])]
        defs = {
            n.name
            for scope in scopes
            for n in getattr(scope, "body", [])
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        params = set()
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        return value.id in defs - params
    return False


METHODS = _methods(ast.parse(path.read_text()) for path in MODULES.values())
"""The names of the package's methods (a callable reached through another object)."""


def wiring_after_construction(sources: dict[str, str]) -> list[str]:
    """Return, for each module's source, each assignment that wires after construction: a
    callable assigned to an attribute anywhere but on `self` in its own `__init__`, and a
    stage's attribute written by another (through `self.<stage>.…`, or a parameter that is
    a stage)."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    data = _fields(trees.values())
    found: list[str] = []
    for name, tree in trees.items():
        for target, stmt, cls, fn in _attribute_writes(tree, None, None):
            found += _wiring(f"{name}:{stmt.lineno}", target, stmt, cls, fn, tree, data)
    return found


Write = ast.Assign | ast.AugAssign | ast.AnnAssign
Scope = ast.FunctionDef | ast.AsyncFunctionDef


def _attribute_writes(
    node: ast.AST, cls: ast.ClassDef | None, fn: Scope | None
) -> Iterator[tuple[ast.Attribute, Write, ast.ClassDef | None, Scope | None]]:
    """Yield each attribute assigned under `node`, with its statement, class and function."""
    if isinstance(node, ast.ClassDef):
        cls, fn = node, None
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        fn = node
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for t in ast.walk(target):  # the parts of `a.x, b.y = ...` too
                if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store):
                    yield t, node, cls, fn
    for child in ast.iter_child_nodes(node):
        yield from _attribute_writes(child, cls, fn)


def _wiring(
    where: str,
    target: ast.Attribute,
    stmt: Write,
    cls: ast.ClassDef | None,
    fn: Scope | None,
    module: ast.Module,
    data: set[str],
) -> list[str]:
    """Return what is wrong with one attribute assignment (nothing, or one finding)."""
    root = _root(target)
    where = f"{where} {ast.unparse(target)}"
    own = root is not None and root[0] == "self" and len(root[1]) == 1
    in_init = fn is not None and fn.name == "__init__"
    value = stmt.value
    callable_ = value is not None and _callable_value(value, cls, fn, module, data)
    if callable_ and not (own and in_init):
        return [f"{where}: a callable wired after construction"]
    if root is None or own:
        return []
    base, attrs = root
    if base == "self" and cls is not None and attrs[0] in _stage_fields(cls):
        return [f"{where}: writes another stage's attribute"]
    if base != "self" and fn is not None:
        args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        if base in {a.arg for a in args if _names_in(a.annotation) & STAGES}:
            return [f"{where}: writes another stage's attribute"]
    return []


def test_stages_are_wired_at_construction() -> None:
    sources = {name: path.read_text() for name, path in MODULES.items()}
    assert wiring_after_construction(sources) == []


def test_the_wiring_check_finds_callbacks_and_writes_across_stages() -> None:
    source = """
class Registry:
    def __init__(self) -> None:
        self.settle = lambda ids: None  # its own, in its own constructor: fine

class Firing:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        registry.settle = self.settle
        self.on_step = lambda: None

    def settle(self, ids: list[str]) -> None:
        self.registry.unsettled = set()
        self.later = self.settle

def refresh(firing: Firing) -> None:
    firing.depth = 3
"""
    assert [f.partition(" ")[0] for f in wiring_after_construction({"m": source})] == [
        "m:9",
        "m:13",
        "m:14",
        "m:17",
    ]
