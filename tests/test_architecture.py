"""The shape of the code, measured from the source: layers, import circles, function length, lazy
imports and single declarations (docs/architecture.md).

- Product modules (``speclive`` minus ``speclive.cli``) never import the command line or the
  benchmarks (``speclive_bench``), not even inside a function.
- The imports a module runs when it is imported form no circle.
- No function of ``speclive`` (the product and its command line) is longer than 80 lines.
- An import of a speclive module inside a function says in a ``# lazy:`` comment why it is not at
  the top (a heavy or optional dependency); at most 60 such imports.
- ``--drafter`` is declared once.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGES = ("speclive", "speclive_bench")
MAX_FUNCTION_LINES = 80
MAX_LAZY_IMPORTS = 60


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    out: dict[str, tuple[Path, ast.Module]] = {}
    for pkg in PACKAGES:
        for path in sorted((SRC / pkg).rglob("*.py")):
            parts = path.relative_to(SRC).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = (path, ast.parse(path.read_text(), str(path)))
    return out


MODULES = _modules()


def _is_product(name: str) -> bool:
    return name.split(".")[0] == "speclive" and not name.startswith("speclive.cli")


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement loads (a ``from pkg import name`` may name a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        is_pkg = MODULES[module][0].name == "__init__.py"
        parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
        base = ".".join([*parts, base] if base else parts)
    found = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
    return [base, *found]


def _ours(targets: list[str]) -> list[str]:
    return [t for t in targets if t.split(".")[0] in PACKAGES and t in MODULES]


def _walk(
    node: ast.AST, in_function: bool = False, type_only: bool = False
) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node with: inside a function body? inside ``if TYPE_CHECKING``?"""
    for child in ast.iter_child_nodes(node):
        fn = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        checking = type_only or (
            isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        )
        yield child, fn, checking
        yield from _walk(child, fn, checking)


def _imports(module: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    for node, in_function, type_only in _walk(MODULES[module][1]):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, in_function, type_only


def test_product_modules_never_import_the_cli_or_the_benchmarks() -> None:
    bad = []
    for module in MODULES:
        if not _is_product(module):
            continue
        for node, _, _ in _imports(module):
            for target in _ours(_targets(module, node)):
                if not _is_product(target):
                    bad.append(f"{module}:{node.lineno} imports {target}")
    assert not bad, "\n".join(bad)


def test_module_level_imports_form_no_circle() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for node, in_function, type_only in _imports(module):
            if in_function or type_only:
                continue
            for target in _ours(_targets(module, node)):
                # a package's own __init__ runs first: importing a submodule implies its parents
                if target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 1:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(m) :], m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for d in sorted(graph[m]):
            visit(d, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_no_function_of_speclive_is_longer_than_a_screen() -> None:
    """The product and its command line (the benchmarks' own check is in test_bench_harness)."""
    long = []
    for module, (_, tree) in MODULES.items():
        if not module.startswith("speclive."):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {n} lines")
    assert not long, "\n".join(long)


def test_lazy_imports_say_why() -> None:
    lazy, silent = [], []
    for module, (path, _) in MODULES.items():
        lines = path.read_text().splitlines()
        for node, in_function, _ in _imports(module):
            if not in_function or not _ours(_targets(module, node)):
                continue
            lazy.append(f"{module}:{node.lineno}")
            near = lines[max(0, node.lineno - 5) : node.lineno]  # its line, or its try or if above
            if not any("# lazy:" in line for line in near):
                silent.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert not silent, "imports inside functions without a '# lazy:' reason:\n" + "\n".join(silent)
    assert len(lazy) <= MAX_LAZY_IMPORTS, lazy


def test_the_drafter_option_is_declared_once() -> None:
    count = sum(path.read_text().count('"--drafter"') for path, _ in MODULES.values())
    assert count == 1
