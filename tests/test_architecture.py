"""The package map, read from the source (static: every import statement of every module, parsed with ast, those
inside functions too): no import cycle among the project's modules, and no import that runs upward against the
layering

    cli, benchmarks -> experiments -> engines -> server_app -> strategies | client_app | deploy
                    -> models | data_partitioning -> flcore

(a package imports its own modules and those of the layers below it; the server/client seam between strategies
and client_app is tests/test_method_contract.py's). The sibling packages in ``APART`` import none of each
other's modules either: what two of them share lives below them (the node-binding table that the server's client
registry reads and deploy/register_node.py writes is flcore/node_bindings.py).

The layering is pyproject.toml's import-linter contract, which .ci/run checks with ``lint-imports`` on the static
imports; these tests check the same layers on a graph that also holds the imports made through importlib, which
no import statement shows (:func:`dynamic_imports`):
flcore.methods loads every declaration module of its ``MODULES``; a module that calls ``flcore.registry.resolve`` on
a declaration's ``"module:attribute"`` field (``decl.strategy``, ``decl.trainer``, ``decl.model_hook``) loads that
field's module of every declared method; a ``"package.module:attribute"`` constant (the engines' default apps)
names a module its holder loads (outside flcore, whose path strings are declaration data). A cycle through them (config -> registry -> methods.fedufo -> config, once) is a
cycle like any other.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _contract_layers() -> tuple[tuple[tuple[str, ...], ...], frozenset[str]]:
    """The layers of pyproject.toml's import-linter contract (the one statement of the layering, which
    ``lint-imports`` checks on the static imports in .ci/run): top first, and the siblings of '|' layers."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    apart = frozenset(p.strip() for layer in layers if "|" in layer for p in layer.split("|"))
    return tuple(tuple(p.strip() for p in layer.replace("|", ":").split(":")) for layer in layers), apart


LAYERS, APART = _contract_layers()  # APART: siblings that never import each other
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


DECL_PATHS = ("strategy", "trainer", "model_hook")  # MethodDecl fields holding a "module:attribute" path
DECLARATION_DATA = "flcore.methods"  # the declaration modules (MODULES)


def _path_module(text: str, modules: dict[str, Path]) -> str | None:
    """The project module of a ``"package.module:attribute"`` string, or None."""
    module, colon, attr = text.partition(":")
    return module if colon and attr.isidentifier() and module in modules else None


def resolved_fields(source: str) -> list[set[str]]:
    """For every function of ``source`` that calls ``resolve(x)`` (flcore.registry's), the declaration path
    fields it reads (``decl.trainer`` -> {"trainer"}); an empty set: a resolve whose path cannot be told."""
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and len(c.args) == 1
                 and (isinstance(c.func, ast.Name) and c.func.id == "resolve"
                      or isinstance(c.func, ast.Attribute) and c.func.attr == "resolve"
                      and isinstance(c.func.value, ast.Name) and c.func.value.id == "registry")]
        if calls:
            out.append({a.attr for a in ast.walk(fn) if isinstance(a, ast.Attribute) and a.attr in DECL_PATHS})
    return out


def dynamic_imports(modules: dict[str, Path], static: dict[str, frozenset[str]]) -> dict[str, set[str]]:
    """The imports made through importlib (see the module docstring), module -> modules it loads."""
    import importlib

    from flcore.methods import MODULES

    out: dict[str, set[str]] = {DECLARATION_DATA: {f"{DECLARATION_DATA}.{name}" for name in MODULES}}
    paths: dict[str, set[str]] = {f: set() for f in DECL_PATHS}
    for name in MODULES:
        for decl in importlib.import_module(f"{DECLARATION_DATA}.{name}").METHODS:
            for f in DECL_PATHS:
                if getattr(decl, f):
                    paths[f].add(getattr(decl, f).partition(":")[0])
    for m, path in modules.items():
        source = path.read_text()
        if "flcore.registry" in static[m]:
            for fields_read in resolved_fields(source):
                if not fields_read:
                    raise AssertionError(f"{m} calls resolve() on a path this test cannot tell (read it from "
                                         f"decl.{' / decl.'.join(DECL_PATHS)})")
                for f in fields_read:
                    out.setdefault(m, set()).update(paths[f])
        if m.split(".")[0] == "flcore":  # the declarations' path strings (and flcore.declaration's BASE_TRAINER,
            continue                     # FEDAVG_STRATEGY) are data, loaded by the resolve() callers above
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if (target := _path_module(node.value, modules)) and target != m:
                    out.setdefault(m, set()).add(target)
    return out


@lru_cache(maxsize=1)
def static_graph() -> dict[str, frozenset[str]]:
    """The imports every import statement shows."""
    modules = module_files()
    return {m: frozenset(imports_of(m, p, modules)) for m, p in modules.items()}


@lru_cache(maxsize=1)
def import_graph() -> dict[str, frozenset[str]]:
    """The static imports plus the ones made through importlib."""
    static = static_graph()
    dynamic = dynamic_imports(module_files(), static)
    return {m: frozenset(outs | dynamic.get(m, set())) for m, outs in static.items()}


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


def sideways(graph: dict[str, frozenset[str]], apart: frozenset[str] = APART) -> list[str]:
    """Every import between two different packages of ``apart`` (siblings of one layer), as 'importer -> imported'."""
    return sorted(f"{m} -> {o}" for m, outs in graph.items() for o in outs
                  if (a := m.split(".")[0]) in apart and (b := o.split(".")[0]) in apart and a != b)


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


def test_sideways_imports_among_the_apart_siblings_are_found():
    """An import from deploy into strategies (what register_node.py did before the binding table moved to
    flcore) is found, in either direction and at any depth; imports within a package, downward, or between
    siblings of a layer not in APART are not."""
    assert set(LAYERS[LAYER["strategies"]]) == APART  # the whole layer: every pair of its packages
    graph = {"deploy.register_node": frozenset({"strategies.node_bindings", "flcore.node_bindings"}),
             "strategies.client_registry": frozenset({"strategies.exchange", "flcore.node_bindings"}),
             "client_app.trainers.base": frozenset({"deploy.tuned", "models.heads"}),
             "models.heads": frozenset({"data_partitioning.stats"})}
    assert sideways(graph) == ["client_app.trainers.base -> deploy.tuned",
                               "deploy.register_node -> strategies.node_bindings"]
    assert upward(graph) == []  # sideways is not upward: the layering test alone let these through


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


def test_no_import_runs_sideways_between_strategies_client_app_and_deploy():
    graph = import_graph()
    assert "flcore.node_bindings" in graph["deploy.register_node"] & graph["strategies.client_registry"]
    assert sideways(graph) == []


@pytest.mark.parametrize("importer, imported", [("server_app.app", "engines"), ("flcore.paper_presets", "flcore.presets"),
                                                ("strategies.update_screen", "strategies.methods.fednova")])
def test_the_imports_that_used_to_break_the_map_are_gone(importer, imported):
    graph = import_graph()
    assert not {o for o in graph[importer] if o == imported or o.startswith(imported + ".")}


def test_the_graph_holds_the_imports_made_through_importlib():
    """flcore.methods loads every module of MODULES; the runner, the ClientApp and build_model load the modules of
    every declaration's Strategy, trainer and model hook; the engines load their default apps."""
    from flcore.methods import MODULES
    from flcore.registry import methods

    graph, static = import_graph(), static_graph()
    assert {f"flcore.methods.{m}" for m in MODULES} <= graph["flcore.methods"]
    assert not {f"flcore.methods.{m}" for m in MODULES} & static["flcore.methods"]  # importlib only
    for decl in methods().values():
        assert decl.strategy.partition(":")[0] in graph["server_app.runner"]
        assert decl.trainer.partition(":")[0] in graph["client_app.app"]
        if decl.model_hook:
            assert decl.model_hook.partition(":")[0] in graph["models"]
    assert "client_app.app" in graph["engines.grid"] and "server_app.app" in graph["engines.local"]


def test_an_import_cycle_through_importlib_is_found():
    """The cycle the static reader missed (flcore/methods/fedufo.py parsing the common section again through
    flcore.config, which loads the declarations through the registry) is one once the importlib edges count;
    the declaration modules import neither flcore.config nor the registry now."""
    graph = dict(import_graph())
    for module in (m for m in graph if m.startswith("flcore.methods.")):
        assert not graph[module] & {"flcore.config", "flcore.registry"}, module
    graph["flcore.methods.fedufo"] = graph["flcore.methods.fedufo"] | {"flcore.config"}
    found = [c for c in cycles(graph) if "flcore.methods.fedufo" in c]
    assert found and {"flcore.config", "flcore.registry", "flcore.methods"} <= set(found[0])
    static = dict(static_graph())
    static["flcore.methods.fedufo"] = static["flcore.methods.fedufo"] | {"flcore.config"}
    assert not [c for c in cycles(static) if "flcore.methods.fedufo" in c]  # what the static graph alone missed


def test_resolve_calls_are_read_by_the_declaration_field_they_resolve():
    source = ("def a(cfg):\n    return resolve(get_method(cfg.method).strategy)(cfg)\n"
              "def b(decl, job):\n    hook = decl.model_hook\n    return registry.resolve(hook)\n"
              "def c(p):\n    return p.resolve()\n"          # Path.resolve(): not the registry's
              "def d(name):\n    return resolve(name)\n")
    assert resolved_fields(source) == [{"strategy"}, {"model_hook"}, set()]


# ------------------------------------------------------------------------ the run config: parsed once, passed down
# Modules that parse flat run-config values into a RunConfig (RunConfig.from_dict): the entry points. A package
# name covers its modules (scripts whose own configs they build).
ENTRY_POINTS = {
    "server_app.preflight": "the ServerApp's main and `noniid-fl run` (check())",
    "client_app.app": "the ClientApp: each run config it receives, parsed once per config (parse_run_config)",
    "engines.local": "run_local / simulate given run-config keys (parse_run_config)",
    "engines.ray": "run_ray given flat values: checked before Ray starts",
    "experiments.run": "an experiment file's runs",
    "benchmarks": "each benchmark script's own configs",
    "deploy": "the deployment tools' own configs (node data, body limits)",
}
# Modules that flatten a RunConfig (to_dict) because the config leaves the process there: the output writers.
CONFIG_WRITERS = {
    "server_app.results": "results.json's run_config echo (also what the checkpoint records)",
    "strategies.messages": "the messages' 'run_config' record (docs/PROTOCOL.md), built once per run config",
    "engines.local": "Flower's run config of the in-process ServerApp's Context and nodes",
    "engines.ray": "Flower's run config of the Ray ServerApp's Context",
    "benchmarks.bench_scale": "stands in for MessageBuilder.base_records (the 'run_config' record)",
    "benchmarks.engine_costs": "stands in for MessageBuilder.base_records (the 'run_config' record)",
}
# Other objects with a to_dict(), by the last name of the receiver: not the run config.
NOT_A_RUN_CONFIG = {"state_ledger": "the client-state ledger's checkpoint form (strategies/state_ledger.py)",
                    "ledger": "the client-state ledger's checkpoint form (strategies/state_ledger.py)",
                    "sec": "RunConfig.to_dict flattening its own sections (flcore/config.py)"}


def _listed(module: str, table: dict[str, str]) -> bool:
    return any(module == k or module.startswith(k + ".") for k in table)


def config_flattening(source: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(every ``X.to_dict()`` call as (line, X), every ``RunConfig.from_dict(...)`` call as (line, code))."""
    flat, parsed = [], []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "to_dict" and not node.args and not node.keywords:
                flat.append((node.lineno, ast.unparse(node.func.value)))
            elif node.func.attr == "from_dict" and ast.unparse(node.func.value) == "RunConfig":
                parsed.append((node.lineno, ast.unparse(node)))
    return sorted(flat), sorted(parsed)


def test_the_config_is_flattened_only_by_writers_and_parsed_only_by_entry_points():
    """No to_dict() round trip: a RunConfig is flattened only where it leaves the process (CONFIG_WRITERS),
    parsed only at an entry point (ENTRY_POINTS), and never parsed back from its own flat form."""
    bad = []
    for module, path in module_files().items():
        flat, parsed = config_flattening(path.read_text())
        for line, receiver in flat:
            if not _listed(module, CONFIG_WRITERS) and receiver.rpartition(".")[2] not in NOT_A_RUN_CONFIG:
                bad.append(f"{module}:{line}: {receiver}.to_dict() (pass the RunConfig; flatten only in a writer)")
        for line, code in parsed:
            if not _listed(module, ENTRY_POINTS) or "to_dict()" in code:
                bad.append(f"{module}:{line}: {code[:80]} (parse at the entry point, pass the object down)")
    assert bad == []


def test_the_flattening_scan_sees_calls_and_round_trips():
    source = ("x = cfg.to_dict()\ny = RunConfig.from_dict(cfg.to_dict())\nz = Dataset.from_dict({})\n"
              "w = a.b.to_dict()\nv = d.to_dict(orient='list')\n")
    flat, parsed = config_flattening(source)
    assert flat == [(1, "cfg"), (2, "cfg"), (4, "a.b")]
    assert parsed == [(2, "RunConfig.from_dict(cfg.to_dict())")]


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


# ------------------------------------------------------------------------------- one home per method and side
# Where a method family's code lives on each side: a module <root>.<family> or a package <root>/<family>/.
HOME_ROOTS = {"flcore": "flcore.methods", "strategies": "strategies.methods", "client_app": "client_app.trainers",
              "models": "models"}
SHARED_TRAINER_MODULES = ("base", "param_tensors")  # client_app/trainers/: the Trainer base and its tensor helpers


def in_home(module: str, family: str) -> bool:
    """Whether ``module`` lies in ``family``'s home on its side (``strategies.methods.fedrane.nash``: fedrane's)."""
    root = HOME_ROOTS.get(module.split(".")[0])
    return root is not None and (module == f"{root}.{family}" or module.startswith(f"{root}.{family}."))


def method_code(owners: dict[str, str], graph: dict[str, frozenset[str]]) -> dict[str, str]:
    """The modules that are one family's code: those :func:`method_owners` gives a family, less those shared
    library code also imports (models/heads.py holds SphereFed's hook but every model's heads: shared)."""
    shared_imports = {o for m, outs in graph.items() if m not in owners and m.split(".")[0] not in TOP for o in outs}
    return {m: f for m, f in owners.items() if m not in shared_imports}


def misplaced_method_code(code: dict[str, str]) -> list[str]:
    """Every module of one family's code outside that family's home on its side, as 'module (family)'."""
    return sorted(f"{m} ({f})" for m, f in code.items() if not in_home(m, f))


def test_the_home_check_flags_what_the_old_layout_scattered():
    """The check on the layout before issue 34: helper modules beside the method modules, a second client module
    next to the trainer, the neck loose in models/ -- each flagged; the packaged layout passes."""
    old = {"strategies.fedrane": "fedrane", "strategies.nash": "fedrane", "client_app.trainers.fedbr": "fedbr",
           "client_app.trainers.fedbr_pseudo": "fedbr", "models.lra": "fedrane", "flcore.methods.fedbr": "fedbr"}
    assert misplaced_method_code(old) == ["client_app.trainers.fedbr_pseudo (fedbr)", "models.lra (fedrane)",
                                          "strategies.fedrane (fedrane)", "strategies.nash (fedrane)"]
    new = {"strategies.methods.fedrane.strategy": "fedrane", "strategies.methods.fedrane.nash": "fedrane",
           "client_app.trainers.fedbr.trainer": "fedbr", "client_app.trainers.fedbr.pseudo_data": "fedbr",
           "models.fedrane.neck": "fedrane", "flcore.methods.fedbr": "fedbr"}
    assert misplaced_method_code(new) == []
    assert not in_home("strategies.methods.fedbcx", "fedbc") and not in_home("server_app.fedbc", "fedbc")
    graph = {"models": frozenset({"models.heads"}), "models.heads": frozenset(), "models.fedrane.neck": frozenset(),
             "client_app.trainers.fedrane": frozenset({"models.fedrane.neck"}), "benchmarks.x": frozenset()}
    owners = {"models.heads": "spherefed", "models.fedrane.neck": "fedrane", "client_app.trainers.fedrane": "fedrane"}
    assert method_code(owners, graph) == {"models.fedrane.neck": "fedrane", "client_app.trainers.fedrane": "fedrane"}


def test_each_method_family_has_one_home_per_side():
    """Every module that is one method family's code (its declaration, Strategy, trainer, model hook, and the
    helpers only they import) lies in that family's home on its side: flcore/methods/<family>.py,
    strategies/methods/<family>[.py|/], client_app/trainers/<family>[.py|/], models/<family>/."""
    code = method_code(method_owners(import_graph()), import_graph())
    assert {"strategies.methods.fedrane.nash", "client_app.trainers.fedbr.pseudo_data", "models.fedrane.relation_graph",
            "models.fedrane.graph_attention", "client_app.trainers.fedufo.equations"} <= set(code)
    assert misplaced_method_code(code) == [], "method code outside its family's home (see docs/ADDING_A_METHOD.md)"


def test_strategies_top_level_holds_only_shared_infrastructure():
    """No method module at strategies/'s top level: each module there is shared code (no family owns it), and
    everything a method family owns on the server side is under strategies/methods/."""
    graph = import_graph()
    owners = method_owners(graph)
    top = [m for m in graph if m.startswith("strategies.") and not m.startswith("strategies.methods")]
    assert "strategies.round_driver" in top and "strategies.base" in top
    assert sorted(f"{m} ({owners[m]})" for m in top if m in owners) == []


def test_every_declared_side_resolves_inside_its_family_home_or_shared_code():
    """Each registered method's Strategy, trainer and model hook import, and each lies in its own family's home
    or in shared code (FedAvg's Strategy, the base Trainer, models/extras.py: what several families use)."""
    import importlib

    from flcore.methods import MODULES
    from flcore.registry import resolve

    code = method_code(method_owners(import_graph()), import_graph())
    wrong, seen = [], 0
    for family in MODULES:
        for decl in importlib.import_module(f"flcore.methods.{family}").METHODS:
            for path in (decl.strategy, decl.trainer, decl.model_hook):
                if not path:
                    continue
                assert callable(resolve(path)), path
                module = path.partition(":")[0]
                seen += 1
                if not in_home(module, family) and module in code:
                    wrong.append(f"{decl.name}: {path} is {code[module]}'s code")
                if module.startswith("strategies.") and not module.startswith("strategies.methods."):
                    wrong.append(f"{decl.name}: {path} is not under strategies/methods/")
    assert seen >= 40 and wrong == []


def _home_entries(root: Path) -> list[str]:
    """The names of the homes under ``root``: modules (without .py) and packages, sorted, duplicates kept."""
    return sorted([p.stem for p in root.glob("*.py") if p.name != "__init__.py"]
                  + [p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()])


def test_method_homes_are_named_for_their_family_and_unique():
    """strategies/methods/ holds one home per registered family (a module or a package, never both),
    client_app/trainers/ those plus the shared Trainer base, a model package is named for its family, and a
    declaration module is one family's."""
    from flcore.methods import MODULES

    families = set(MODULES)
    server = _home_entries(ROOT / "strategies" / "methods")
    client = _home_entries(ROOT / "client_app" / "trainers")
    assert len(server) == len(set(server)) and len(client) == len(set(client)), "a home both module and package"
    assert set(server) <= families, f"not a method family: {sorted(set(server) - families)}"
    assert set(client) - families == set(SHARED_TRAINER_MODULES), \
        "client_app/trainers/ holds the families' trainers and the shared Trainer base only (SHARED_TRAINER_MODULES)"
    model_packages = [p.name for p in (ROOT / "models").iterdir() if (p / "__init__.py").exists()]
    assert set(model_packages) <= families and "fedrane" in model_packages
    assert set(_home_entries(ROOT / "flcore" / "methods")) == families


# ------------------------------------------------------------------------ the strategy base: parts, not mixins
# the strategy infrastructure: every module of strategies/ outside strategies/methods/ (the methods' homes)
INFRASTRUCTURE = tuple(sorted(m for m in module_files() if m.startswith("strategies.")
                              and not m.startswith("strategies.methods")))
STRATEGY_SELF = ("FLStrategy", "FlowerStrategyAPI", "TensorState")  # classes whose ``self`` is the whole strategy


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def class_members(cls: ast.ClassDef) -> set[str]:
    """What a class defines: its methods and class attributes (annotated ones: dataclass fields, declared
    dependencies), ``__slots__`` and every ``self.<name>`` its methods assign."""
    out: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.add(target.id)
                    if target.id == "__slots__" and isinstance(node.value, (ast.Tuple, ast.List)):
                        out |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    for node in ast.walk(cls):
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


def self_uses(cls: ast.ClassDef) -> dict[str, int]:
    """Every ``self.<name>`` a class's code reads or calls -> the first line it does."""
    out: dict[str, int] = {}
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and isinstance(node.ctx, ast.Load)):
            out.setdefault(node.attr, node.lineno)
    return out


def foreign_private_uses(tree: ast.AST) -> list[str]:
    """Every ``<x>._name`` whose object is not ``self``/``cls``: reaching into another object's private member."""
    return [f"{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _is_private(node.attr)
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]


def strategy_classes(modules: tuple[str, ...] | None = None) -> dict[str, ast.ClassDef]:
    """'module.Class' -> its class node, for the given modules of strategies/ (every module by default)."""
    files = {m: p for m, p in module_files().items() if m.split(".")[0] == "strategies"}
    out = {}
    for m in modules or tuple(files):
        for node in ast.walk(ast.parse(files[m].read_text())):
            if isinstance(node, ast.ClassDef):
                out[f"{m}.{node.name}"] = node
    return out


def part_violations(classes: dict[str, ast.ClassDef], strategy_self: tuple[str, ...]) -> list[str]:
    """What breaks the parts rule in ``classes``: a ``self._name`` its class does not define (a mixin calling a
    sibling's private helper), and - for a part, i.e. any class but ``strategy_self`` - any ``self.<name>``
    its class does not define (a part uses only its own members and what it was given)."""
    bad = []
    for qual, cls in classes.items():
        own = class_members(cls)
        for name, line in sorted(self_uses(cls).items()):
            if name in own or name.startswith("__"):
                continue
            if _is_private(name) or cls.name not in strategy_self:
                bad.append(f"{qual}:{line}: self.{name}")
    return bad


def test_the_parts_check_finds_mixins_reaching_into_each_other():
    """The checks flag what the four-mixin base did: a mixin calling its sibling's private helper through
    ``self``, a part reading state it does not own, and code reaching into another object's private member."""
    source = ("class Registry:\n"
              "    def refresh(self):\n        return self._base_content(0)\n"           # a sibling's helper
              "class Driver:\n"
              "    def __init__(self, registry):\n        self.registry = registry\n        self._memo = None\n"
              "    def run(self):\n        self._memo = self.registry.clients\n"         # own members: fine
              "        return self.cfg, self.registry._node_owners()\n"                    # not its own; private
              "class FLStrategy(Registry, Driver):\n"
              "    def hook(self):\n        return self.refresh(), self._memo\n")        # public fine, private not
    tree = ast.parse(source)
    classes = {f"m.{n.name}": n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert part_violations(classes, ("FLStrategy",)) == ["m.Registry:3: self._base_content", "m.Driver:10: self.cfg",
                                                          "m.FLStrategy:13: self._memo"]
    assert foreign_private_uses(tree) == ["10: self.registry._node_owners"]


def test_no_strategy_part_reaches_into_another_ones_members():
    """strategies/base.py's FLStrategy composes parts (registry, messages, checks, driver, ledger), each owning
    its state; none calls another's private members, and a part reads only what it defines or was given."""
    assert foreign_private_uses(ast.parse("")) == []
    reached = {m: hits for m in INFRASTRUCTURE
               if (hits := foreign_private_uses(ast.parse(module_files()[m].read_text())))}
    assert reached == {}
    classes = strategy_classes(INFRASTRUCTURE)
    assert {"strategies.client_registry.ClientRegistry", "strategies.round_driver.RoundDriver",
            "strategies.update_checks.UpdateChecks", "strategies.state_ledger.StateLedger",
            "strategies.messages.MessageBuilder"} <= set(classes)
    assert part_violations(classes, STRATEGY_SELF) == []


def test_method_strategies_use_no_private_member_of_the_base():
    """A method's strategy (wherever its module lives in strategies/) uses the base through its public hooks
    and parts: a ``self._name`` it reads is its own, never one that only the base or a part defines."""
    infra = strategy_classes(INFRASTRUCTURE)
    base_private = {n for cls in infra.values() for n in class_members(cls) if _is_private(n)}
    assert {"_node_owners", "_flower_sent", "_params_memo"} <= base_private
    bad = []
    for qual, cls in strategy_classes().items():
        if qual in infra:
            continue
        own = class_members(cls)
        bad += [f"{qual}:{line}: self.{n}" for n, line in self_uses(cls).items() if n in base_private and n not in own]
        bad += [f"{qual}: {hit}" for hit in foreign_private_uses(cls) if hit.split(".")[-1].split("(")[0] in base_private]
    assert bad == []


def test_the_strategy_is_composed_of_its_parts_and_one_flower_face():
    """FLStrategy inherits only Flower's face (flower_api.py, which Flower's ``start()`` calls methods of); the
    registry, messages, checks, round driver and state ledger are parts it holds, each given its
    dependencies, and the face uses only public members the strategy defines."""
    from flwr.serverapp.strategy import Strategy

    from flcore.config import RunConfig
    from strategies.base import FLStrategy
    from strategies.client_registry import ClientRegistry
    from strategies.flower_api import FlowerStrategyAPI
    from strategies.messages import MessageBuilder
    from strategies.round_driver import RoundDriver
    from strategies.update_checks import UpdateChecks

    assert [c for c in FLStrategy.__mro__ if c.__module__.startswith("strategies.")] == [FLStrategy, FlowerStrategyAPI]
    s = FLStrategy(RunConfig())
    assert (type(s.registry), type(s.messages), type(s.checks), type(s.driver)) == (
        ClientRegistry, MessageBuilder, UpdateChecks, RoundDriver)
    assert s.driver.registry is s.registry and s.driver.steps is s and s.ledger is None
    s.begin_run()
    assert s.ledger is not None and s.ledger.starts == [1]
    classes = strategy_classes(("strategies.base", "strategies.flower_api"))
    face, strategy = classes["strategies.flower_api.FlowerStrategyAPI"], classes["strategies.base.FLStrategy"]
    borrowed = set(self_uses(face)) - class_members(face)
    assert borrowed and not {n for n in borrowed if _is_private(n)}
    assert borrowed <= class_members(strategy) | set(dir(Strategy)), borrowed - class_members(strategy)
