"""The package's floors, checked from its source: imports point only downwards, and never in a circle.

Every ``import`` and ``from ... import`` of every module is read with :mod:`ast`, those inside
functions included (a function-level import that hides a cycle is still a cycle). Floors, from
the bottom (docs/architecture.md):

0. ``convlib.core`` -- values and contracts;
1. ``convlib.cpu``, ``convlib.sycl``, ``convlib.cuda`` -- the backends, which import only the
   core and themselves (never each other);
2. ``convlib.dispatch`` -- devices, registry, selection, tuning, plans;
3. ``convlib.api``, ``convlib.tune`` -- the public functions; ``convlib.dask``, where the API sends
   Dask arrays (it runs the in-memory functions the API passes it, so it never imports the API);
4. ``convlib`` (its ``__init__``) -- the public names;
5. ``convlib.bench``, ``convlib.testing`` -- tools on top; ``convlib.torch``, ``convlib.jax`` --
   the framework integrations, which only ``import convlib.torch`` (``.jax``) loads.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import convlib

PACKAGE_DIR = Path(convlib.__file__).resolve().parent

#: (floor, module prefixes), bottom first.
FLOORS = (
    (0, ("convlib.core",)),
    (1, ("convlib.cpu", "convlib.sycl", "convlib.cuda")),
    (2, ("convlib.dispatch",)),
    (3, ("convlib.api", "convlib.tune", "convlib.dask")),
    (5, ("convlib.bench", "convlib.testing", "convlib.torch", "convlib.jax")),
)
BACKENDS = ("convlib.cpu", "convlib.sycl", "convlib.cuda")


def module_files() -> dict[str, Path]:
    """Module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def floor_of(module: str) -> int:
    if module == "convlib":
        return 4
    for floor, prefixes in FLOORS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return floor
    raise AssertionError(f"{module} is on no floor: add it to FLOORS and to docs/architecture.md")


def backend_of(module: str) -> str | None:
    return next((b for b in BACKENDS if module == b or module.startswith(b + ".")), None)


def imports_of(module: str, path: Path, modules: dict) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            # "import convlib.cpu.blis" and "from convlib.cpu import blis" both name the module;
            # a name that is not a module is an attribute of its longest module prefix.
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name.startswith("convlib") and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def test_every_import_points_down():
    upward, across = [], []
    for module, targets in import_graph().items():
        for target in targets:
            if target == "convlib" and module != "convlib":
                # importing a submodule runs the package's __init__ anyway; naming it is a tool's
                # privilege only (bench uses the public names)
                if floor_of(module) < 5:
                    upward.append(f"{module} -> convlib")
                continue
            if floor_of(target) > floor_of(module):
                upward.append(f"{module} -> {target}")
            a, b = backend_of(module), backend_of(target)
            if a and b and a != b:
                across.append(f"{module} -> {target}")
    assert not upward, "imports pointing up a floor:\n" + "\n".join(sorted(upward))
    assert not across, "a backend importing another backend:\n" + "\n".join(sorted(across))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_can_fail():
    """The graph reader sees function-level and relative imports, and the checks catch a cycle."""
    graph = import_graph()
    assert "convlib.dispatch.select" in graph["convlib.dispatch.plan"]  # a module-level relative import
    assert "convlib.sycl.tables" in graph["convlib.bench.sycl"]  # a function-level one
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert floor_of("convlib.core.problem") < floor_of("convlib.cpu.direct") < floor_of("convlib.dispatch.plan")


def test_import_convlib_loads_no_framework():
    """The framework integrations are optional extras: ``import convlib`` must not need them."""
    code = ("import sys, convlib; loaded = {'torch', 'jax', 'dask', 'convlib.torch', 'convlib.jax', 'convlib.dask'}"
            " & set(sys.modules); "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_numba_cuda_is_imported_by_one_module():
    """Moving to numba-cuda's successor must stay a one-module change (docs/gpu.md): only
    ``convlib/cuda/launch.py`` imports numba in the CUDA backend and the GPU benchmarks."""
    package = Path(convlib.__file__).parent
    files = sorted(package.glob("cuda/*.py")) + sorted(package.glob("bench/gpu_*.py"))
    importers = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(n == "numba" or n.startswith("numba.") or n.startswith("numba_cuda") for n in names):
                importers.add(path.relative_to(package).as_posix())
    assert importers == {"cuda/launch.py"}, f"numba imported outside convlib/cuda/launch.py: {sorted(importers)}"
