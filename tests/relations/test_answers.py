"""Every public solve of `retrax.relations` answers in one shape: an
`AbstractSolution` with its answer as `value`, a `result`, `stats` holding
`num_steps` once, and the `throw=` argument (the diffusion side is
tests/diffusion/test_solutions.py)."""

import dataclasses
import inspect
import typing
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import retrax.diffusion as rd
import retrax.relations as rr
from helpers import gaussian_energy_factor
from retrax._solution import AbstractSolution


SCHED = rd.VPSDE()
ANGLES = jnp.linspace(0, 2 * jnp.pi, 12, endpoint=False)
RING = rr.ImplicitDiffusion(
    rd.GaussianMixtureEps(
        SCHED, jnp.stack([jnp.cos(ANGLES), jnp.sin(ANGLES)], -1), jnp.full(12, 0.05)
    ),
    rr.field_nodes(jax.random.key(0), 2, samples=4),
)
Z0, RHO = jnp.array([0.6, 0.5]), jnp.array([jnp.inf, 0.0])
GF = rr.GaussianFactor
GRAPH = rr.FactorGraph(
    {"a": 1, "b": 1},
    [GF.prior("a", [1.0], 2.0), GF.between("a", "b", 1.0, [0.5])],
)

# Public functions that return a solution but do not solve, sample or train:
# `roots_by_energy` reorders the answers of `implicit_roots`.
NOT_SOLVES = {"roots_by_energy"}


def _returns_a_solution(f) -> type | None:
    """The `AbstractSolution` subclass `f`'s return annotation names, if any."""
    f = inspect.unwrap(f)
    if not inspect.isfunction(f):
        return None
    hint = typing.get_type_hints(f).get("return")
    if inspect.isclass(hint) and issubclass(hint, AbstractSolution):
        return hint
    return None


def _solvers() -> dict[str, typing.Any]:
    return {
        name: getattr(rr, name)
        for name in dir(rr)
        if not name.startswith("_")
        and not inspect.isclass(getattr(rr, name))
        and _returns_a_solution(getattr(rr, name)) is not None
        and name not in NOT_SOLVES
    }


QUERIES = jnp.array([[0.6, 0.5], [0.5, 0.6]])
TARGETS = jnp.array([0.8, 0.85])


def _squared_error(z, target):
    return (z[1] - target) ** 2


def _call(name):
    """One small call of each public solve, with its default `throw=True`."""
    factor = gaussian_energy_factor(SCHED)
    marks = {"x": rr.Observed(jnp.asarray(0.5))}
    calls = {
        "implicit_infer": lambda: rr.implicit_infer(RING, Z0, RHO),
        "implicit_roots": lambda: rr.implicit_roots(
            RING, Z0, RHO, jax.random.key(1), n_starts=4
        ),
        "implicit_pullback": lambda: rr.implicit_pullback(
            RING, rr.implicit_infer(RING, Z0, RHO), Z0, RHO, jnp.array([0.0, 1.0])
        ),
        "factor_infer": lambda: rr.factor_infer(factor, marks),
        "factor_pullback": lambda: rr.factor_pullback(
            factor,
            rr.factor_infer(factor, marks),
            marks,
            jnp.array([0.0, 1.0, 0.5]),
        ),
        "solve_graph": lambda: rr.solve_graph(GRAPH),
        "propagate_beliefs": lambda: rr.propagate_beliefs(GRAPH),
        "task_gradient": lambda: rr.task_gradient(
            RING, QUERIES, RHO, TARGETS, _squared_error
        ),
        "fit_through_inference": lambda: rr.fit_through_inference(
            RING,
            QUERIES,
            RHO,
            TARGETS,
            _squared_error,
            jax.random.key(2),
            epochs=2,
            progress=False,
        ),
    }
    return calls[name]()


def test_every_solve_is_walked():
    # a new public solve needs a call in `_call`, and is then checked below
    assert set(_solvers()) == {
        "factor_infer",
        "factor_pullback",
        "fit_through_inference",
        "implicit_infer",
        "implicit_pullback",
        "implicit_roots",
        "propagate_beliefs",
        "solve_graph",
        "task_gradient",
    }


@pytest.mark.parametrize("name", sorted(_solvers()))
@pytest.mark.full
def test_solve_answers_in_one_shape(name):
    f = _solvers()[name]
    throw = inspect.signature(f).parameters.get("throw")
    assert throw is not None and throw.default is True
    kind = _returns_a_solution(f)
    fields = [field.name for field in dataclasses.fields(kind)]
    # the answer is `value`: a field, or (for the pullbacks, whose answer is
    # their cotangents) a property reading them
    assert "value" in fields or isinstance(
        inspect.getattr_static(kind, "value"), property
    )
    assert {"result", "stats"} <= set(fields)
    # the step count lives in `stats` only
    assert "steps" not in fields and "num_steps" not in fields
    with warnings.catch_warnings():
        # the answer's own names, not a deprecated one, are read below
        warnings.simplefilter("error", DeprecationWarning)
        sol = _call(name)
        assert isinstance(sol, kind)
        assert bool(jnp.all(sol.result == rr.RESULTS.successful))
        assert "num_steps" in sol.stats
        assert bool(jnp.all(jnp.asarray(sol.stats["num_steps"]) >= 0))
        leaves = jax.tree.leaves(eqx.filter(sol.value, eqx.is_inexact_array))
        assert leaves and all(bool(jnp.all(jnp.isfinite(v))) for v in leaves)


def test_the_relation_argument_has_one_name():
    # every public function of `retrax.relations` that takes a relation calls
    # it `relation`; the old keyword `model=` still works, with a warning
    takers = {}
    for name in dir(rr):
        f = getattr(rr, name)
        if name.startswith("_") or inspect.isclass(f) or not callable(f):
            continue
        for param in inspect.signature(f).parameters.values():
            hint = typing.get_type_hints(inspect.unwrap(f)).get(param.name)
            if hint is rr.AbstractImplicitRelation:
                takers[name] = param.name
    assert {"implicit_infer", "task_gradient", "calibrate_off_data"} <= set(takers)
    assert set(takers.values()) == {"relation"}, takers
    with pytest.warns(DeprecationWarning, match="the argument is `relation`"):
        sol = rr.implicit_infer(model=RING, z0=Z0, rho=RHO)
    assert jnp.array_equal(sol.value, rr.implicit_infer(RING, Z0, RHO).value)
    with pytest.raises(TypeError, match="both `model` and `relation`"):
        rr.implicit_infer(Z0, RHO, model=RING, relation=RING)


@pytest.mark.full
def test_the_adjoint_is_given_as_optimistix_takes_it():
    # `adjoint=optx.ImplicitAdjoint(linear_solver=...)` is `adjoint_solver=`
    import lineax as lx
    import optimistix as optx

    def dy_dx(**options):
        def y(x):
            return rr.implicit_infer(RING, Z0.at[0].set(x), RHO, **options).value[1]

        return jax.grad(y)(0.6)

    want = dy_dx(adjoint_solver=lx.QR())
    got = dy_dx(adjoint=optx.ImplicitAdjoint(linear_solver=lx.QR()))
    assert bool(jnp.isfinite(want)) and float(want) != 0.0
    assert float(got) == float(want)
    with pytest.raises(ValueError, match="not both"):
        rr.implicit_infer(
            RING, Z0, RHO, adjoint=optx.ImplicitAdjoint(), adjoint_solver=lx.LU()
        )
    with pytest.raises(TypeError, match="`adjoint` must be an"):
        rr.implicit_infer(RING, Z0, RHO, adjoint=optx.RecursiveCheckpointAdjoint())
