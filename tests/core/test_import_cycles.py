"""No import cycle between the modules of dflash/, lazy imports inside functions included
(docs/design.md invariant 24: a package imports only from lower layers; this holds it
between modules of one package too)."""

from __future__ import annotations

import ast

from helpers import REPO


def module_imports() -> dict[str, set[str]]:
    """dflash module -> the dflash modules it imports anywhere in its file."""
    paths = {p: ".".join(p.relative_to(REPO).with_suffix("").parts) for p in (REPO / "dflash").rglob("*.py")}
    names = {name.removesuffix(".__init__") for name in paths.values()}
    graph = {}
    for path, name in paths.items():
        name = name.removesuffix(".__init__")
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])])
                found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        graph[name] = {module for module in found if module in names and module != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if state.get(other) == "open":
                return stack[stack.index(other) :] + [other]
            if other not in state and (cycle := visit(other)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    return next((cycle for node in sorted(graph) if node not in state and (cycle := visit(node))), None)


def test_no_module_imports_itself_through_others():
    graph = module_imports()
    assert len(graph) > 100 and "dflash.decoding.chain" in graph["dflash.decoding.loop"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_walk_finds_a_cycle_through_a_lazy_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
