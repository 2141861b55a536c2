"""The router's modules import each other without a circle (TYPE_CHECKING imports included: a circle
hidden behind one still ties the modules together). metrics.py reads the router through the RouterState
protocol instead of importing proxy.py, which imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import infer_ctl.router

PACKAGE = "infer_ctl.router"
ROOT = Path(infer_ctl.router.__file__).parent


def module_name(path: Path) -> str:
    """infer_ctl.router.http.h1 for router/http/h1.py, infer_ctl.router.http for router/http/__init__.py"""
    return ".".join([PACKAGE, *(p for p in path.relative_to(ROOT).with_suffix("").parts if p != "__init__")])


def imports_within_package() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    paths = sorted(ROOT.rglob("*.py"))
    names = {module_name(path) for path in paths}
    for path in paths:
        name = module_name(path)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == PACKAGE or node.module.startswith(PACKAGE + "."):
                    # from infer_ctl.router.http import h1, sse: the modules h1 and sse, else the module itself
                    subs = {f"{node.module}.{a.name}" for a in node.names} & names
                    deps |= subs or {node.module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith(PACKAGE + ".")}
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep):], dep]
            if dep not in state and (found := visit(dep)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_router_package_has_no_import_circle() -> None:
    graph = imports_within_package()
    proxy, metrics = f"{PACKAGE}.request.proxy", f"{PACKAGE}.fleet.metrics"
    assert proxy in graph and proxy not in graph[metrics]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_circle() -> None:
    # the check above can fail: the old metrics <-> proxy pair is found
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


#: the most lines a class of the router may take: one with more does several jobs (the review behind the
#: split of KvStream, KvRouting, StateSync, Admin, Coalescer, FlightBoard and H1Connection)
MAX_CLASS_LINES = 300


def test_no_class_of_the_router_is_over_300_lines() -> None:
    big = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    big.append(f"{path.relative_to(ROOT)}: {node.name} ({lines} lines)")
    assert not big, "classes over 300 lines (split them by job): " + "; ".join(big)
