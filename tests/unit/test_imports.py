"""The import graph of seal_lite has no circle: layers depend downwards only (docs/architecture.md).

Every import counts, including those inside functions (kept there only to make --help fast) and those under
TYPE_CHECKING: a circle that only type checkers see is still a circle a reader must untangle.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "seal_lite"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}  # visiting | done

    def visit(node, path):
        state[node] = "visiting"
        for target in sorted(graph[node]):
            if state.get(target) == "visiting":
                return path[path.index(target):] + [target] if target in path else [node, target]
            if target not in state and (cycle := visit(target, path + [target])):
                return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [node])):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_seal_lite_has_no_import_circle():
    graph = import_graph()
    assert "seal_lite.run.train" in graph["seal_lite.cli"]  # the graph is really read
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
