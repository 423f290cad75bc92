"""The import graph of vkc's own packages (aot/vkc, contract/vkc_contract, cli/vkc_cli, runtime/vkc_runtime),
read from the sources with ``ast``: no cycle, and the layering the packages promise.

Edges: every ``import`` / ``from ... import`` statement, at module level *and* inside functions (a deferred
import that closes a cycle is still a cycle a reader has to untangle), plus ``importlib.import_module`` with a
constant name. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
Importing a submodule also runs its parent packages' ``__init__``; that implicit edge is not counted (every
package would "cycle" with the modules its ``__init__`` re-exports).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"vkc": REPO / "aot", "vkc_contract": REPO / "contract", "vkc_cli": REPO / "cli",
         "vkc_runtime": REPO / "runtime", "vkc_engine": REPO / "runtime", "vkc_server": REPO / "runtime"}


def _modules() -> dict[str, Path]:
    mods = {}
    for top, base in ROOTS.items():
        for p in sorted((base / top).rglob("*.py")):
            parts = list(p.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


MODULES = _modules()
NATIVE_MODULES = {"vkc_runtime._native"}  # compiled (csrc/launcher.cpp): a leaf, imports nothing of vkc's


def _is_package(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def _resolve_from(mod: str, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    pkg = mod if _is_package(mod) else mod.rpartition(".")[0]
    for _ in range(level - 1):
        pkg = pkg.rpartition(".")[0]
    return f"{pkg}.{target}" if target else pkg


def imports_of(mod: str) -> list[tuple[str, int, bool]]:
    """(imported module name, line, at module level) for every import in ``mod`` (names outside vkc's packages
    included, unresolved)."""
    tree = ast.parse(MODULES[mod].read_text(), str(MODULES[mod]))
    top_level = {id(n) for n in tree.body}
    for n in tree.body:  # module-level try/if blocks count as module level
        if isinstance(n, (ast.Try, ast.If)):
            top_level.update(id(c) for c in ast.walk(n) if isinstance(c, (ast.Import, ast.ImportFrom)))
    out = []
    for node in ast.walk(tree):
        at_top = id(node) in top_level
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, at_top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(mod, node.level, node.module)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub if sub in MODULES or sub in NATIVE_MODULES else base, node.lineno, at_top))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.args[0].value, node.lineno, False))
    return out


def graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for name, _, _ in imports_of(m):
            if name in MODULES and name != m:
                g[m].add(name)
    return g


def find_cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_walker_sees_the_packages():
    assert {"vkc.regen", "vkc_contract.abi", "vkc_cli.main", "vkc_runtime.kernels", "vkc_runtime.ops.norm",
            "vkc_runtime.loaders.triton_cubin"} <= set(MODULES)
    g = graph()
    assert "vkc_runtime.bound" in g["vkc_runtime.ops.norm"]             # from ..bound import CallCache
    assert "vkc_runtime.memory" in g["vkc_runtime.ops.norm"]            # from .. import memory
    assert "vkc_runtime.bound" in g["vkc_runtime.kernels"]              # a function-level import counts
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    cycles = find_cycles(graph())
    assert not cycles, "import cycles (module-level and function-level imports): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def _offenders(prefix: str, allowed) -> list[str]:
    bad = []
    for m in MODULES:
        if m.split(".")[0] != prefix:
            continue
        for name, line, _ in imports_of(m):
            if not allowed(name.split(".")[0]):
                bad.append(f"{MODULES[m].relative_to(REPO)}:{line} imports {name}")
    return bad


def test_layering():
    # the generator never depends on the runtime (nor on the CLI that fronts both)
    assert _offenders("vkc", lambda top: top not in ("vkc_runtime", "vkc_cli")) == []
    # the runtime never depends on the generator or the CLI
    assert _offenders("vkc_runtime", lambda top: top not in ("vkc", "vkc_cli", "vkc_engine", "vkc_server")) == []
    # the engine stands on the runtime only (never the generator, the CLI or the server)
    assert _offenders("vkc_engine", lambda top: top not in ("vkc", "vkc_cli", "vkc_server")) == []
    # the server stands on the engine (and through it the runtime), never the generator or the CLI
    assert _offenders("vkc_server", lambda top: top not in ("vkc", "vkc_cli")) == []
    # the contract is the standard library only
    assert _offenders("vkc_contract", lambda top: top == "vkc_contract" or top == "__future__"
                      or top in sys.stdlib_module_names) == []


def test_ops_do_not_import_the_registry():
    """Ops declare their bases as data; the registry reads them (one direction)."""
    for m in MODULES:
        if m.startswith("vkc_runtime.ops"):
            assert "vkc_runtime.registry" not in {n for n, _, _ in imports_of(m)}, m
