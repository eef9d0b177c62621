"""Every module of retrax is abstract or final, as equinox's are.

An `Abstract*` class declares its interface (`abc.abstractmethod`,
`eqx.AbstractVar`); a final class implements it and is never subclassed. So no
concrete method of a class in `src/retrax` is redefined below it, and no
concrete class has subclasses. Shared defaults are module-level helpers that
the final classes call. Equinox 0.13 has no check of its own (its `strict=`
argument is kept only for compatibility and checks nothing), so the test walks
the package itself.
"""

import abc
import importlib
import importlib.machinery
import importlib.util
import inspect
import pathlib
import pkgutil

import equinox as eqx

import retrax


SOURCE = pathlib.Path(retrax.__file__).resolve().parent
# Equinox runs every class's `__check_init__` along the MRO: each checks its own
# fields, none replaces another.
NOT_OVERRIDES = frozenset({"__check_init__"})


def _retrax_modules():
    """Import every Python module under `src/retrax`.

    The native kernels' shared library is loaded through ctypes by
    `retrax._native`, not imported; it holds no classes.
    """
    modules = [retrax]
    for info in pkgutil.walk_packages(retrax.__path__, prefix="retrax."):
        origin = importlib.util.find_spec(info.name).origin or ""
        if origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            continue
        modules.append(importlib.import_module(info.name))
    return modules


def _retrax_module_classes():
    """Every `eqx.Module` subclass defined in retrax, in a stable order."""
    classes = {}
    for module in _retrax_modules():
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, eqx.Module)
                and value.__module__.split(".")[0] == "retrax"
            ):
                classes[f"{value.__module__}.{value.__qualname__}"] = value
    return [classes[name] for name in sorted(classes)]


def _function(member):
    """The function behind a method, property or class/static method, or None."""
    if isinstance(member, property):
        return member.fget
    if isinstance(member, (classmethod, staticmethod)):
        return member.__func__
    if inspect.isfunction(member):
        return member
    return None


def _written_in_retrax(function) -> bool:
    """Whether `function` was written in `src/retrax`, not generated.

    Equinox and dataclasses generate `__init__`, `__repr__`, `__eq__`, ... from
    the fields; their code has no file of its own.
    """
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    return SOURCE in pathlib.Path(code.co_filename).resolve().parents


def _concrete_methods(cls) -> set[str]:
    """The names of the concrete methods written in `cls`'s own body."""
    names = set()
    for name, member in vars(cls).items():
        function = _function(member)
        if function is None or name in NOT_OVERRIDES:
            continue
        if getattr(member, "__isabstractmethod__", False):
            continue
        if _written_in_retrax(function):
            names.add(name)
    return names


def _own_names(cls) -> set[str]:
    """Every name `cls` defines itself: methods, properties and fields."""
    return set(vars(cls)) | set(vars(cls).get("__annotations__", {}))


def _is_abstract(cls) -> bool:
    return cls.__name__.lstrip("_").startswith("Abstract")


def _name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_no_concrete_method_is_overridden():
    classes = _retrax_module_classes()
    # The walk reaches every subpackage (a module it missed would hide its
    # classes): a few classes from far apart.
    names = {_name(cls) for cls in classes}
    for expected in (
        "retrax._effect.AbstractRangedEffect",
        "retrax.effects._gain.Gain",
        "retrax.filters._svf.SVF",
        "retrax.relations._graph_factor.AbstractGraphFactor",
        "retrax.losses._time_domain.SNRLoss",
    ):
        assert expected in names
    offenders = []
    for cls in classes:
        concrete = _concrete_methods(cls)
        for below in classes:
            if below is cls or not issubclass(below, cls):
                continue
            # `below` is a subclass of `cls` at any depth: a name of a concrete
            # method of `cls` that its own body defines again (as a method, a
            # property or a field) overrides that method.
            for name in sorted(concrete & _own_names(below)):
                offenders.append(
                    f"{_name(below)}.{name} overrides the concrete {_name(cls)}.{name}"
                )
    assert not offenders, (
        f"{len(offenders)} concrete methods are overridden (make the base's "
        "method abstract and call a module-level helper from each final "
        "class):\n" + "\n".join(offenders)
    )


def test_only_abstract_classes_are_subclassed():
    classes = _retrax_module_classes()
    offenders = []
    for cls in classes:
        if _is_abstract(cls):
            continue
        subclasses = [
            _name(below)
            for below in classes
            if below is not cls and issubclass(below, cls)
        ]
        if subclasses:
            offenders.append(f"{_name(cls)} is subclassed by {', '.join(subclasses)}")
    assert not offenders, (
        "concrete classes are final; only Abstract* classes are subclassed:\n"
        + "\n".join(offenders)
    )


def test_abstract_methods_are_abstract():
    # The walk above relies on `abc.abstractmethod` being what marks a method
    # abstract; pin that it tells the two apart on a class built here.
    class AbstractThing(eqx.Module):
        @abc.abstractmethod
        def value(self) -> float: ...

        def twice(self) -> float:
            return 2 * self.value()

    assert getattr(vars(AbstractThing)["value"], "__isabstractmethod__", False)
    assert not getattr(vars(AbstractThing)["twice"], "__isabstractmethod__", False)
    # Written here, not in src/retrax: not counted as retrax's method.
    assert not _written_in_retrax(vars(AbstractThing)["twice"])
    # The generated `__init__` has no source file.
    assert not _written_in_retrax(vars(AbstractThing)["__init__"])


def test_functions_do_one_job():
    # A function longer than 120 lines, its docstring aside, mixes jobs that
    # read better as functions of their own (argument checks, resumption, a
    # loop): every function of src/retrax stays within it.
    import ast

    root = pathlib.Path(retrax.__file__).parent
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            if ast.get_docstring(node) is not None:
                doc = node.body[0]
                lines -= doc.end_lineno - doc.lineno + 1
            if lines > 120:
                long.append(
                    f"{path.relative_to(root)}:{node.lineno} {node.name}: {lines}"
                )
    assert not long, "functions over 120 lines without their docstring:\n" + "\n".join(
        long
    )


def test_relations_solve_linear_systems_through_lineax():
    # A raw `jnp.linalg.solve` returns a plausible number for a singular
    # system and has no result code; the relations' solvers go through
    # lineax (`throw=False`) and carry its result into theirs.
    raw = [
        f"{path.name}:{number}"
        for path in sorted((SOURCE / "relations").glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "linalg.solve(" in line
    ]
    assert raw == []
