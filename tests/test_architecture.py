"""The package map, read from the source (static: every import statement of every module, parsed with ast, those
inside functions too): no import cycle among the project's modules, and no import that runs upward against the
layering

    cli, benchmarks -> experiments -> engines -> server_app -> strategies | client_app | deploy
                    -> models | data_partitioning -> flcore

(a package imports its own modules and those of the layers below it; the server/client seam between strategies
and client_app is tests/test_method_contract.py's).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS: tuple[tuple[str, ...], ...] = (("cli", "benchmarks"), ("experiments",), ("engines",), ("server_app",),
                                       ("strategies", "client_app", "deploy"), ("models", "data_partitioning"),
                                       ("flcore",))
LAYER = {pkg: depth for depth, pkgs in enumerate(LAYERS) for pkg in pkgs}  # 0: the top


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the layered packages (a package is its __init__)."""
    out: dict[str, Path] = {}
    for pkg in LAYER:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The project module an imported name lives in (``a.b.c`` -> ``a.b`` when c is not a module), or None
    for a name from outside the project."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that ``module`` imports anywhere in its file (``from p import m`` of a submodule m
    counts as importing ``p.m``; relative imports are resolved)."""
    out: set[str] = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {o for a in node.names if (o := _owner(a.name, modules))}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if (o := full if full in modules else _owner(base, modules)):
                    out.add(o)
    out.discard(module)
    return out


@lru_cache(maxsize=1)
def import_graph() -> dict[str, frozenset[str]]:
    modules = module_files()
    return {m: frozenset(imports_of(m, p, modules)) for m, p in modules.items()}


def cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted: every import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def upward(graph: dict[str, frozenset[str]]) -> list[str]:
    """Every import of a module of a higher layer, as 'importer -> imported'."""
    return sorted(f"{m} -> {o}" for m, outs in graph.items() for o in outs
                  if LAYER[o.split(".")[0]] < LAYER[m.split(".")[0]])


# ---------------------------------------------------------------------------------------- the checks themselves
def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The reader finds imports at module level and inside functions, plain, from-, relative and submodule
    imports, and ignores names from outside the project."""
    for pkg in LAYER:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "flcore" / "sub").mkdir()
    (tmp_path / "flcore" / "sub" / "__init__.py").write_text("from . import leaf\n")
    (tmp_path / "flcore" / "sub" / "leaf.py").write_text("import numpy\nfrom ..base import X\n")
    (tmp_path / "flcore" / "base.py").write_text("def f():\n    from flcore.sub.leaf import g\n")
    (tmp_path / "server_app" / "app.py").write_text("import engines.grid\nfrom flcore import sub\n")
    (tmp_path / "engines" / "grid.py").write_text("import os\n")
    modules = module_files(tmp_path)
    graph = {m: frozenset(imports_of(m, p, modules)) for m, p in modules.items()}
    assert graph["flcore.sub"] == {"flcore.sub.leaf"}
    assert graph["flcore.sub.leaf"] == {"flcore.base"}
    assert graph["flcore.base"] == {"flcore.sub.leaf"}           # a function-level import counts
    assert graph["server_app.app"] == {"engines.grid", "flcore.sub"}
    assert cycles(graph) == [["flcore.base", "flcore.sub.leaf"]]
    assert upward(graph) == ["server_app.app -> engines.grid"]


def test_the_layering_covers_every_package():
    """Every top-level Python package of the project has a layer (a new package must be placed)."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(LAYER), f"packages without a layer: {sorted(packages - set(LAYER))}"


def test_no_import_cycle_among_the_project_modules():
    graph = import_graph()
    assert len(graph) > 150 and any(graph.values())  # (the reader found the project)
    assert cycles(graph) == [], "import cycles (each a set of modules importing each other, at any depth)"


def test_no_import_runs_upward_against_the_layering():
    assert upward(import_graph()) == []


@pytest.mark.parametrize("importer, imported", [("server_app.app", "engines"), ("flcore.paper_presets", "flcore.presets"),
                                                ("strategies.validation", "strategies.methods.fednova")])
def test_the_imports_that_used_to_break_the_map_are_gone(importer, imported):
    graph = import_graph()
    assert not {o for o in graph[importer] if o == imported or o.startswith(imported + ".")}


# ------------------------------------------------------------------------------- method knowledge stays home
TOP = ("cli", "benchmarks", "experiments")  # drivers: they pick methods by name (a baseline, a table row) by design
PAPER_TABLE = "flcore.paper_presets"         # the paper presets: each row names its paper's method by design


def method_owners(graph: dict[str, frozenset[str]]) -> dict[str, str]:
    """module -> the method family (declaration module of flcore/methods) whose code it is: the declaration
    module, the modules only that family's declarations name (Strategy, trainer, model hook), and - to a fixed
    point - the modules that only that family's modules import (helpers such as
    strategies/methods/fedrane/nash.py). A module two families name or import (the base trainer, FedAvg's
    strategy, models/extras.py) is shared code."""
    import importlib

    from flcore.methods import MODULES

    named: dict[str, set[str]] = {}
    for family in MODULES:
        decl_module = f"flcore.methods.{family}"
        named.setdefault(decl_module, set()).add(family)
        for decl in importlib.import_module(decl_module).METHODS:
            for path in (decl.strategy, decl.trainer, decl.model_hook):
                if path:
                    named.setdefault(path.partition(":")[0], set()).add(family)
    owner = {m: next(iter(fams)) for m, fams in named.items() if len(fams) == 1}
    library = {m for m in graph if m.split(".")[0] not in TOP}
    importers: dict[str, set[str]] = {}
    for m in library:
        for o in graph[m]:
            importers.setdefault(o, set()).add(m)
    changed = True
    while changed:
        changed = False
        for m in sorted(library - set(owner) - set(named)):
            families = {owner.get(i) for i in importers.get(m, ())}
            if len(families) == 1 and None not in families:
                owner[m] = families.pop()
                changed = True
    return owner


def method_name_tests(source: str, names: set[str]) -> list[str]:
    """Every place in ``source`` that tests a value against a method name: a comparison (==, !=, in, not in,
    also inside a tuple/set/list operand), a ``match`` case, or a ``startswith``/``endswith`` call, with a
    string constant that is a registered method's name; as 'line: code'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.match_case):
            operands = [node.pattern]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith")):
            operands = list(node.args)
        else:
            continue
        if any(isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in names
               for op in operands for c in ast.walk(op)):
            line = node.pattern.lineno if isinstance(node, ast.match_case) else node.lineno
            found.append(f"{line}: {ast.unparse(node.pattern if isinstance(node, ast.match_case) else node)[:100]}")
    return found


def test_the_method_name_scan_finds_every_form_of_test():
    names = {"fedufo", "fedbc"}
    source = ("if cfg.method == 'fedufo': pass\n"
              "x = m in ('fedavg', 'fedbc')\n"
              "match cfg.method:\n    case 'fedufo': pass\n"
              "y = name.startswith('fedbc')\n"
              "z = cfg.method == 'fedavg' or 'fedufo'.upper()\n"   # fedavg is not in names; a bare use is no test
              "w = {'fedufo': 1}\n")
    assert [f.split(":")[0] for f in method_name_tests(source, names)] == ["1", "2", "4", "5"]


def test_method_ownership_reads_the_declarations():
    owners = method_owners(import_graph())
    assert owners["flcore.methods.fedufo"] == owners["strategies.methods.fedufo"] == "fedufo"
    # helpers only FedRANE imports
    assert owners["strategies.methods.fedrane.nash"] == owners["models.fedrane.neck"] == "fedrane"
    for shared in ("client_app.trainers.base", "strategies.methods.fedavg", "strategies.round_driver", "client_app.app",
                   "server_app.preflight", "models.extras", "flcore.config"):
        assert shared not in owners, shared


def test_no_method_name_is_compared_in_shared_code():
    """Shared code (server_app/, engines/, client_app/app.py, the strategy and trainer bases, models/, flcore/,
    data_partitioning/, deploy/) asks a method's declaration (flcore/registry.py: payload, hooks, head,
    check_federation) instead of testing which method runs."""
    from flcore.registry import methods

    graph = import_graph()
    owners = method_owners(graph)
    names = set(methods())
    modules = module_files()
    shared = [m for m in graph if m not in owners and m.split(".")[0] not in TOP and m != PAPER_TABLE]
    assert "server_app.preflight" in shared and "client_app.app" in shared and "engines.local" in shared
    bad = {m: hits for m in sorted(shared) if (hits := method_name_tests(modules[m].read_text(), names))}
    assert bad == {}, "method names tested in shared code: declare a hook on the method instead"
