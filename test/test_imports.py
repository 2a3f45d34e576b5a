"""Lynx's import structure, read from the source with `ast`: every import of a Lynx module at the
top of its module (none hidden in a function or class body, bar a short commented allow-list), an
engine-free core (nothing under `python/lynx` imports SGLang), and no import cycle among Lynx modules
(function-level imports counted)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "lynx": ROOT / "python" / "lynx",
    "lynx_deploy": ROOT / "python" / "lynx_deploy",
    "lynx_patches": ROOT / "lynx_patches",
    "lynx_kernels": ROOT / "kernels" / "lynx_kernels",
}

# (importing module, imported module) pairs that may import inside a function, each for its reason.
NESTED_ALLOWED = {
    # Triton is optional: `lynx_kernels` imports it at module level, so the reference codec
    # imports the kernels only when it dispatches to them.
    ("lynx.codec.pool", "lynx_kernels"): "Triton (optional)",
}


class Import(NamedTuple):
    """One imported Lynx (or SGLang) module, where, and whether inside a function or class body."""

    source: str
    target: str
    line: int
    nested: bool


def module_files() -> dict[str, Path]:
    """Every product module's dotted name and file."""
    modules = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")) if folder.is_dir() else ():
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules an import statement names: ``from p import m`` names ``p.m`` where that is a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
        base = ".".join(anchor + ([base] if base else []))
    return list(dict.fromkeys(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names))


def imports_of(module: str, path: Path, known: set[str]) -> list[Import]:
    """Every import in `module`'s source, each marked nested when inside a function or class body."""
    found: list[Import] = []
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _imported(child, module, is_package, known):
                    found.append(Import(module, target, child.lineno, nested))
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def _is_lynx(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    files = module_files()
    return [imp for module, path in files.items() for imp in imports_of(module, path, set(files))]


def _allowed(imp: Import) -> bool:
    """Whether `imp` is an allowed nested import (of the allowed module or one inside it)."""
    return any(imp.source == src and (imp.target + ".").startswith(dst + ".") for src, dst in NESTED_ALLOWED)


def test_no_lynx_module_is_imported_inside_a_function_or_class(imports):
    hidden = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in imports
        if i.nested and _is_lynx(i.target) and not _allowed(i)
    ]
    assert not hidden, "imports inside a function or class:\n" + "\n".join(hidden)


def test_every_allowed_nested_import_still_exists(imports):
    """The allow-list names only imports that are there (a stale entry would hide a new one)."""
    for source, target in NESTED_ALLOWED:
        uses = [i for i in imports if i.nested and i.source == source and _allowed(i) and i.target.startswith(target)]
        assert uses, f"{source} no longer imports {target} inside a function: drop it from NESTED_ALLOWED"


def test_the_core_never_imports_sglang(imports):
    engine = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in imports
        if i.source.split(".")[0] == "lynx" and i.target.split(".")[0] == "sglang"
    ]
    assert not engine, "\n".join(engine)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph `edges` as the path that closes it, or None."""
    done: set[str] = set()
    for start in sorted(edges):
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(edges.get(start, ()))))] if start not in done else []
        if stack:
            path.append(start)
            on_path.add(start)
        while stack:
            node, successors = stack[-1]
            following = next(successors, None)
            if following is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif following in on_path:
                return path[path.index(following) :] + [following]
            elif following not in done:
                stack.append((following, iter(sorted(edges.get(following, ())))))
                path.append(following)
                on_path.add(following)
    return None


def test_lynx_modules_import_each_other_without_a_cycle(imports):
    edges: dict[str, set[str]] = {}
    for i in imports:
        if _is_lynx(i.target) and i.target != i.source:
            edges.setdefault(i.source, set()).add(i.target)
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_find_cycle_returns_the_loop_and_none_on_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_nested_and_relative_imports_are_found(tmp_path):
    source = tmp_path / "__init__.py"
    source.write_text(
        "import lynx.config\n"
        "from . import sibling\n"
        "def f():\n    from lynx.codec import spec\n"
        "class C:\n    import lynx_kernels\n"
    )
    found = imports_of("lynx_patches.pd", source, {"lynx_patches.pd.sibling", "lynx.codec.spec"})
    assert found == [
        Import("lynx_patches.pd", "lynx.config", 1, False),
        Import("lynx_patches.pd", "lynx_patches.pd.sibling", 2, False),
        Import("lynx_patches.pd", "lynx.codec.spec", 4, True),
        Import("lynx_patches.pd", "lynx_kernels", 6, True),
    ]
