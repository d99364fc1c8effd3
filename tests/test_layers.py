"""hocc's layers only import downward, and no module-level import cycle
exists, read off the source with `ast` (nothing is imported to check it).

    topology < plan < config < executor < record < engine < api < backend < paro < hocc < bench < tools

An import of `hocc.X` from a module of layer L needs X's layer below L (or
X in L). hocc._C (the extension) is below everything; the package root
(`import hocc`, the public calls) is above the library, so only the
benchmark and the command-line tools may import it.
Imports inside functions count as well. Each that stays inside a function
is listed in FUNCTION_LEVEL with its reason, so a new one is a decision,
not a way around a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent / "hocc"
LAYERS = ["topology", "plan", "config", "executor", "record", "engine", "api", "backend", "paro", "<root>", "bench",
          "tools"]
RANK = {name: i for i, name in enumerate(LAYERS)} | {"_C": -1}

# (importing module, imported module): why the import waits for the function
FUNCTION_LEVEL = {
    ("hocc.executor", "hocc._C"): "the extension loads on first use, so planning and the tools run without a build",
    ("hocc.paro", "hocc.paro.shard"): "hocc.paro's strategy and models import no torch; paro_shard brings it",
    ("hocc.config", "hocc.topology"): "a topology file is parsed only when a setting names one",
    ("hocc.bench.cli", "hocc.bench.launch"): "ranks start from a forkserver; `hocc-bench --help` and the "
                                              "parent's argument checks come first",
    ("hocc.bench.report", "hocc.bench.collectives"): "reports and plots are made from JSON without torch",
    ("hocc.bench.runner", "hocc.engine.group_engines"): "a rank's engine, looked up only when auto is timed",
    ("hocc.bench.runner", "hocc.executor.cpp_form"): "the same",
    ("hocc.bench.runner", "hocc.plan.crossover"): "the same",
    ("hocc.bench.faults", "hocc"): "a rank of the fault matrix imports torch and hocc; the driver that starts "
                                   "the ranks and judges them runs without them",
    ("hocc.bench.faults", "hocc.engine.group_engines"): "the same",
    ("hocc.bench.planted_faults", "hocc"): "the same, for a planted fault's rank",
    ("hocc.tools.calibrate_cli", "hocc.tools.calibrate_nccl"): "nccl-tests logs are read only when given",
    ("hocc.tools.calibrate_nccl", "hocc.bench.sizes"): "sizes are parsed only for a log's own sweep",
    ("hocc.tools.plan_cli", "hocc.tools.draw"): "matplotlib only for --draw",
    ("hocc.tools.trace_cli", "hocc.record.plot"): "matplotlib only for --plot",
    ("hocc.tools.tune_cli", "hocc"): "`hocc tune` imports torch and the backend only when it runs, not for --help",
    ("hocc.tools.tune_cli", "hocc.bench.collectives"): "the same",
    ("hocc.tools.tune_cli", "hocc.engine.group_engines"): "the same",
    ("hocc.tools.tune_cli", "hocc.executor.cpp_form"): "the same",
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return "<root>" if len(parts) == 1 else parts[1]


def _target(module: str, name: str) -> str:
    """What `from module import name` imports: the submodule module.name where
    there is one (hocc._C included), else module."""
    base = ROOT.parent.joinpath(*module.split("."))
    if (name == "_C" and module == "hocc") or (base / f"{name}.py").exists() or (base / name / "__init__.py").exists():
        return f"{module}.{name}"
    return module


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported hocc module, at module level?, line) of every hocc import,
    leaving out `if TYPE_CHECKING:` blocks (annotations only)."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, not in_function, child.lineno) for a in child.names
                           if a.name.split(".")[0] == "hocc")
            elif isinstance(child, ast.ImportFrom) and child.module and child.module.split(".")[0] == "hocc":
                out.extend((_target(child.module, a.name), not in_function, child.lineno) for a in child.names)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return out


def _all() -> dict[str, list[tuple[str, bool, int]]]:
    return {_module(p): _imports(p) for p in sorted(ROOT.rglob("*.py"))}


def test_layers_only_import_downward() -> None:
    wrong = []
    for mod, imports in _all().items():
        own = _layer(mod)
        for target, _, line in imports:
            theirs = _layer(target) if target != "hocc._C" else "_C"
            if theirs != own and not RANK[theirs] < RANK[own]:
                wrong.append(f"{mod} (line {line}, layer {own}) imports {target} (layer {theirs})")
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_no_module_level_import_cycle() -> None:
    graph = nx.DiGraph()
    mods = _all()
    for mod, imports in mods.items():
        for target, top, _ in imports:
            if top and target in mods and target != mod:
                graph.add_edge(mod, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"module-level import cycles: {cycles[:5]}"


def test_every_function_level_import_has_its_reason() -> None:
    found = {(mod, target) for mod, imports in _all().items() for target, top, _ in imports if not top}
    listed = set(FUNCTION_LEVEL)
    assert found == listed, (f"function-level imports without a reason: {sorted(found - listed)}; "
                             f"listed but gone: {sorted(listed - found)}")
