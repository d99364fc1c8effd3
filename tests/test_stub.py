"""hocc/_C.pyi says what hocc._C has: the same module-level names, and each
class the same members of its own (mypy checks callers against the stub, so
a binding missing from it is unchecked, and one it lists that _C lacks is a
promise nothing keeps)."""

from __future__ import annotations

import ast
from pathlib import Path

from hocc.executor import load
from hocc.plan.types import COLLECTIVES

STUB = Path(__file__).resolve().parent.parent / "hocc" / "_C.pyi"


def _stub() -> tuple[set[str], dict[str, set[str]]]:
    names: set[str] = set()
    classes: dict[str, set[str]] = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            classes[node.name] = {m.name for m in node.body if isinstance(m, ast.FunctionDef)} - {"__init__"}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names, classes


def test_stub_lists_what_the_extension_has() -> None:
    c = load()
    names, classes = _stub()
    real = {k for k in dir(c) if not k.startswith("_")}
    assert names == real, (f"_C has, the stub lacks: {sorted(real - names)}; "
                           f"the stub has, _C lacks: {sorted(names - real)}")
    for cls, members in classes.items():
        own = {k for k in vars(getattr(c, cls)) if not k.startswith("_")}
        assert members == own, f"{cls}: _C has, the stub lacks: {sorted(own - members)}; the stub has, _C lacks: " \
                               f"{sorted(members - own)}"


def test_collectives_in_one_order() -> None:
    """Python's collective names are C++'s, in C++'s order (a CallId carries the index)."""
    assert tuple(load().COLLECTIVES) == COLLECTIVES
