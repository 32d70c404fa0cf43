"""The package's layout keeps its promises (docs/design.md, "Layers"): no import cycle, each layer
imports only the layers below it, and few modules at the top.

Imports are read from the source as Python reads them: every `import` and `from ... import`,
inside functions too; only those under `if TYPE_CHECKING:` are left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mcpmux"
LAYERS = ["batching", "wire", "inference", "core", "upstream", "tools", "mux", "server", "cli"]
"""mcpmux's own layers, lowest first: a module imports from its own layer or the ones before it.
`errors` sits below them all. `inference` (the engine) knows nothing of MCP: `core/config` reads its
settings, `mux`, `tools` and `server` use the engine through it."""
INFERENCE_LAYERS = ["errors", "kernels", "models", "engine", "serving", "openai"]
"""The engine's own layers, lowest first (`mcpmux.inference.X`)."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _imports(name: str, typing_only: bool = False) -> set[str]:
    """The mcpmux modules `name` imports when it runs (`typing_only`: those under `if TYPE_CHECKING:`)."""
    tree = ast.parse(MODULES[name].read_text())
    skipped = _type_checking_lines(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if (getattr(node, "lineno", 0) in skipped) is not typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {module for module in found if module in MODULES and module != name and module != "mcpmux"}


GRAPH = {name: _imports(name) for name in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert _cycles() == []


def test_each_layer_imports_only_the_layers_below_it() -> None:
    upward = []
    for module, targets in GRAPH.items():
        layer = _layer(module)
        for target in targets:
            below = _layer(target)
            if layer is not None and below is not None and LAYERS.index(below) > LAYERS.index(layer):
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_no_type_only_import_points_back_up() -> None:
    """`if TYPE_CHECKING:` imports never run, but one that points to a higher layer, or closes a circle,
    is a dependency all the same: the lower module knows the higher one (a Protocol says what it needs)."""
    back = []
    for module in MODULES:
        for target in _imports(module, typing_only=True):
            layer, above = _layer(module), _layer(target)
            upward = layer is not None and above is not None and LAYERS.index(above) > LAYERS.index(layer)
            if upward or module in _reachable(target):
                back.append(f"{module} -> {target}")
    assert back == []


def _reachable(start: str) -> set[str]:
    """The modules `start` imports at run time, directly or through others."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        for target in GRAPH[stack.pop()]:
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def test_the_engine_is_layered_inside_too() -> None:
    upward = []
    for module, targets in GRAPH.items():
        layer = _inference_layer(module)
        for target in targets:
            below = _inference_layer(target)
            if (
                layer is not None
                and below is not None
                and INFERENCE_LAYERS.index(below) > INFERENCE_LAYERS.index(layer)
            ):
                upward.append(f"{module} -> {target}")
    assert upward == []


def _inference_layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "inference" or parts[2] not in INFERENCE_LAYERS:
        return None
    return parts[2]


def test_at_most_twelve_modules_at_the_top() -> None:
    top = [path.name for path in PACKAGE.glob("*.py")]
    assert len(top) <= 12, top


def test_the_check_sees_real_imports() -> None:
    """Guards the reader above: it finds a known import, and skips a known TYPE_CHECKING one."""
    assert "mcpmux.mux.dispatcher" in GRAPH["mcpmux.mux.multiplexer"]
    assert "mcpmux.mux.multiplexer" not in GRAPH["mcpmux.tools.meta"]
