"""The README's test command runs a default set that reaches every public name.

The default set (`python3 -m pytest`) leaves out the tests marked `slow`
(acceptance runs), `full` (deeper cases of functions the default set already
covers: second derivatives, parity tables past their first rows, programs
that take seconds to compile) and `float32` (their own session); `.ci/run`
runs them all. This module reads the test files (no import, no run) and checks
that every public name of retrax is used by some test of the default set,
directly or through the helpers, fixtures and tables it uses.
"""

import ast
import pathlib

import pytest
from test_docs import SUBPACKAGES

import retrax


TESTS = pathlib.Path(__file__).parents[1]
LEFT_OUT = {"slow", "full", "float32"}
# Public names a user receives rather than calls: tests reach them through
# what returns them. (Abstract classes and solution types are told apart by
# their base classes, below.)
RECEIVED = {
    "Checkpoint": "load_checkpoint's answer",
    "DataSupport": "calibrate_off_data's stored training rows",
    "InferenceHistory": "fit_through_inference's history",
    "MixtureBelief": "implicit_mixture's answer",
    "STFTLossTerms": "the STFT losses' terms (output='full')",
    "SumAndDifferenceTerms": "SumAndDifferenceSTFTLoss's terms (output='full')",
    "default_prox_input": "ProxNetwork's default input",
}


def _marks(decorators: list[ast.expr]) -> set[str]:
    """The `pytest.mark.X` names among decorators (called or not)."""
    found = set()
    for node in decorators:
        node = node.func if isinstance(node, ast.Call) else node
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark"
        ):
            found.add(node.attr)
    return found


def _module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            values = (
                node.value.elts if isinstance(node.value, ast.List) else [node.value]
            )
            return _marks(values)
    return set()


def _names(node: ast.AST) -> set[str]:
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.arg):
            names.add(sub.arg)  # a fixture, by its name
        elif isinstance(sub, ast.alias):
            names.add(sub.asname or sub.name.rsplit(".", 1)[-1])
    return names


def _read_tests():
    """(names each default-set test uses, names each helper definition uses)."""
    tests, helpers = [], {}
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        module_marks = _module_marks(tree)
        for node in tree.body:
            bodies = [(node, set())]
            if isinstance(node, ast.ClassDef):
                bodies = [(sub, _marks(node.decorator_list)) for sub in node.body]
            for sub, class_marks in bodies:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    marks = module_marks | class_marks | _marks(sub.decorator_list)
                    if not sub.name.startswith("test"):
                        helpers.setdefault(sub.name, set()).update(_names(sub))
                    elif not marks & LEFT_OUT:
                        tests.append(_names(sub))
                elif isinstance(sub, ast.Assign | ast.AnnAssign | ast.ClassDef):
                    targets = sub.targets if isinstance(sub, ast.Assign) else [sub]
                    for target in targets:
                        name = getattr(target, "id", getattr(target, "name", None))
                        if name is not None:
                            helpers.setdefault(name, set()).update(_names(sub))
    return tests, helpers


def _reached() -> set[str]:
    tests, helpers = _read_tests()
    reached = set().union(*tests)
    todo = list(reached & helpers.keys())
    while todo:
        for name in helpers.pop(todo.pop(), ()):
            if name not in reached:
                reached.add(name)
                if name in helpers:
                    todo.append(name)
    return reached


def _public(module) -> set[str]:
    """The names a user calls or builds."""
    from retrax._solution import AbstractSolution

    names = set()
    for name in dir(module):
        obj = getattr(module, name)
        if name.startswith("_") or isinstance(obj, type(retrax)) or name in RECEIVED:
            continue
        if isinstance(obj, type) and (
            name.startswith("Abstract") or issubclass(obj, AbstractSolution)
        ):
            continue
        names.add(name)
    return names


@pytest.fixture(scope="module")
def reached():
    return _reached()


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_the_default_set_reaches_every_public_name(subpackage, reached):
    missing = sorted(_public(getattr(retrax, subpackage)) - reached)
    assert not missing, (
        f"no test of the default set (unmarked `slow`, `full`, `float32`) uses "
        f"these names of retrax.{subpackage}: {missing}"
    )


def test_the_default_set_reaches_every_top_level_name(reached):
    missing = sorted(_public(retrax) - reached)
    assert not missing, f"no test of the default set uses retrax.{missing}"


def test_the_reader_sees_marks():
    # the reader itself: a marked test is left out, an unmarked one counted
    source = (
        "import pytest\n"
        "@pytest.mark.full\n"
        "def test_a():\n    alpha()\n"
        "@pytest.mark.parametrize('x', [1])\n"
        "def test_b(x):\n    beta()\n"
    )
    tree = ast.parse(source)
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert _marks(defs[0].decorator_list) == {"full"}
    assert _marks(defs[1].decorator_list) == {"parametrize"}
    assert "beta" in _names(defs[1]) and "x" in _names(defs[1])
