"""The package layers: the library (``fairseq_sret``) imports nothing of the lab
(``fairseq_sret_cli``), its pure-PyTorch parts import no fairseq, and no modules import
each other in a circle. Read from the source (every import statement, those inside
functions too), so a lazy import that would break the rule is caught as well."""

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import pytest

from conftest import REPO

LIBRARY, LAB = "fairseq_sret", "fairseq_sret_cli"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_level_only: bool = False) -> Iterator[Tuple[str, int]]:
    """``(absolute module, line)`` of every import in ``path``; ``from . import x`` gives
    ``package.x`` when ``x`` is a module (else the package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                yield (candidate if _is_module(candidate) else target), node.lineno


def _is_module(dotted: str) -> bool:
    path = REPO.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def sources(package: str):
    return sorted((REPO / package).rglob("*.py"))


def test_the_library_imports_nothing_from_the_lab():
    found = [f"{p.relative_to(REPO)}:{line} imports {target}"
             for p in sources(LIBRARY) for target, line in imports(p)
             if target.split(".")[0] == LAB]
    assert not found, "the library must not import the lab:\n" + "\n".join(found)


@pytest.mark.parametrize("package", [f"{LIBRARY}.core", f"{LIBRARY}.vision"])
def test_the_pure_pytorch_parts_import_no_fairseq(package):
    found = [f"{p.relative_to(REPO)}:{line} imports {target}"
             for p in sources(package.replace(".", "/")) for target, line in imports(p)
             if target.split(".")[0] in ("fairseq", "fairseq_cli") or target.startswith(f"{LIBRARY}.models")]
    assert not found, "\n".join(found)


def _graph() -> Dict[str, Set[str]]:
    """Module -> the project modules it imports at its top level (what runs on import)."""
    graph: Dict[str, Set[str]] = {}
    for package in (LIBRARY, LAB):
        for path in sources(package):
            graph[module_name(path)] = {target for target, _ in imports(path, top_level_only=True)
                                        if target.split(".")[0] in (LIBRARY, LAB)}
    return graph


def test_no_import_circles():
    graph = _graph()
    for module, targets in graph.items():  # a package's __init__ importing its own modules is no circle
        graph[module] = {t for t in targets if t != module and t in graph}
    state: Dict[str, int] = {}
    circles = []

    def visit(module: str, stack: list) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circle = stack[stack.index(target):] + [target]
                # a module importing a name from its own package's __init__, which does not
                # import it back, is fine; report only true circles
                circles.append(" -> ".join(circle))
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_checker_sees_a_lab_import_and_a_circle(tmp_path, monkeypatch):
    """The two rules above catch what they are for: a library module importing the lab
    (relative or absolute, inside a function too), and two modules importing each other."""
    lib = tmp_path / LIBRARY
    lab = tmp_path / LAB
    lib.mkdir()
    lab.mkdir()
    (lib / "__init__.py").write_text("")
    (lab / "__init__.py").write_text("")
    (lib / "a.py").write_text("from . import b\n\ndef f():\n    import fairseq_sret_cli.tool\n")
    (lib / "b.py").write_text("from .a import f\n")
    (lab / "tool.py").write_text("import fairseq_sret\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = [t for t, _ in imports(lib / "a.py")]
    assert "fairseq_sret_cli.tool" in found and "fairseq_sret.b" in found
    with pytest.raises(AssertionError, match="must not import the lab"):
        test_the_library_imports_nothing_from_the_lab()
    with pytest.raises(AssertionError, match="fairseq_sret.a -> fairseq_sret.b -> fairseq_sret.a"):
        test_no_import_circles()


@pytest.mark.e2e
@pytest.mark.parametrize("module", [LIBRARY, f"{LIBRARY}.core", f"{LIBRARY}.vision"])
def test_importing_the_pure_pytorch_parts_loads_neither_fairseq_nor_the_lab(module):
    code = (f"import sys, {module}; print(sorted(m for m in sys.modules"
            f" if m.split('.')[0] in ('fairseq', 'fairseq_cli', '{LAB}')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_tests_mirror_the_packages_with_unique_module_names():
    """tests/<area>/test_<module>.py, one name per test module: they import each other's helpers
    by name (tests/conftest.py puts every test folder on the path)."""
    names = [p.name for p in (REPO / "tests").rglob("test_*.py") if ".timm" not in p.parts]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
    areas = {p.relative_to(REPO / "tests").parts[0] for p in (REPO / "tests").rglob("test_*.py") if ".timm" not in p.parts}
    assert {"core", "models", "vision", "hf", "checkpoints", "conversion", "cli"} <= areas


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 80


def oversized(paths) -> list:
    """``path: what`` for every module over :data:`MAX_MODULE_LINES` lines and every function
    (method, nested function) over :data:`MAX_FUNCTION_LINES`, decorators excluded."""
    found = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path.name}: {node.name} is {length} lines")
    return found


def test_no_module_is_over_500_lines_and_no_function_over_80():
    assert oversized(sources(LIBRARY) + sources(LAB)) == []


def test_the_size_check_sees_a_long_module_and_a_long_function(tmp_path):
    long_function = tmp_path / "long_function.py"
    long_function.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    long_module = tmp_path / "long_module.py"
    long_module.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    short = tmp_path / "short.py"
    short.write_text("def f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1))
    assert oversized([long_function, long_module, short]) == [
        f"long_function.py: f is {MAX_FUNCTION_LINES + 1} lines", f"long_module.py: {MAX_MODULE_LINES + 1} lines"]
