"""slotd's import graph: the modules directly under slotd/ and the import cycles among all of
slotd's modules. Every import counts, module-level, function-level and under TYPE_CHECKING
alike; a package's __init__ importing its own modules does not (that is how a package
re-exports). `python3 tests/tools/import_cycles.py` prints both; tests/test_layout.py holds them."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def _targets(name: str, is_init: bool, node: ast.AST, known: dict) -> list[str]:
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            here = name.split(".") if is_init else name.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join(here + ([node.module] if node.module else []))
        for alias in node.names:
            # `from pkg import mod` names the module; `from mod import thing` the module
            full = f"{base}.{alias.name}"
            names.append(full if full in known else base)
    out = []
    for target in names:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target:
            out.append(target)
    return out


def graph(package: Path) -> tuple[dict[str, set[str]], dict[str, tuple[Path, bool]]]:
    known = modules(package)
    edges: dict[str, set[str]] = defaultdict(set)
    for name, (path, is_init) in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _targets(name, is_init, node, known):
                if target == name or (is_init and target.startswith(name + ".")):
                    continue
                edges[name].add(target)
    return edges, known


def cycles(edges: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return sorted(found)


def top_level(known: dict[str, tuple[Path, bool]]) -> list[str]:
    return sorted(n for n, (_, is_init) in known.items() if n.count(".") == 1 and not is_init)


def main() -> int:
    edges, known = graph(ROOT / "slotd")
    top = top_level(known)
    found = cycles(edges, sorted(known))
    print(f"modules directly under slotd/: {len(top)}")
    print(f"import cycles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    return 0


if __name__ == "__main__":
    sys.exit(main())
