"""A graph solve never reports a wrong success: bad dtypes and factors raise
naming the argument, a failed solve raises a message about the graph (or,
with `throw=False`, gives NaN answers and NaN derivatives for the failed
member only), and inputs near the dtype's limits are solved."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.relations as rr


pytestmark = pytest.mark.loud

FG, GF = rr.FactorGraph, rr.GaussianFactor


def _prior_answer(p):
    graph = FG({"a": 1}, [GF.prior("a", [1.0], p)])
    return rr.solve_graph(graph, throw=False).x[0]


def _untouched_answer(p):
    graph = FG({"a": 1, "b": 1}, [GF.prior("a", [1.0], p)])
    return rr.solve_graph(graph, throw=False).x[0]


@pytest.mark.full
def test_a_zero_precision_gives_nan_derivatives():
    grad = jax.grad(_prior_answer)(0.0)
    assert np.isnan(grad)
    sol = rr.solve_graph(FG({"a": 1}, [GF.prior("a", [1.0], 0.0)]), throw=False)
    assert sol.result == rr.RESULTS.singular
    assert bool(jnp.isnan(sol.x[0]))


def test_a_variable_no_factor_touches_gives_nan_derivatives():
    assert np.isnan(jax.grad(_untouched_answer)(2.0))
    # the answer of a well-posed member is still differentiable: x = 1 for
    # every positive precision
    assert float(jax.grad(_prior_answer)(2.0)) == 0.0


@pytest.mark.full
def test_only_the_failed_member_of_a_batch_is_nan():
    grads = jax.vmap(jax.grad(_prior_answer))(jnp.array([0.0, 2.0, 0.0]))
    assert np.isnan(grads[0]) and np.isnan(grads[2])
    assert float(grads[1]) == 0.0

    def mean_answer(m):
        graph = FG({"a": 1}, [GF.prior("a", m, 2.0)])
        return rr.solve_graph(graph, throw=False).x[0]

    # a NaN target: NaN, not 0, for that member; 1 (dx/dm) for the others
    means = jnp.array([[jnp.nan], [0.5]])
    grads = jax.vmap(jax.grad(mean_answer))(means)
    assert np.isnan(grads[0, 0])
    np.testing.assert_allclose(grads[1], [1.0], rtol=1e-12)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_dtype_is_refused(dtype):
    graph = FG({"a": 1}, [GF.prior("a", [1.0], 1.0)])
    with pytest.raises(TypeError, match="`dtype`.*float32 or float64"):
        rr.solve_graph(graph, dtype=dtype)
    with pytest.raises(TypeError, match=r"`init\['a'\]`"):
        rr.solve_graph(graph, {"a": jnp.zeros(1, dtype)})


def test_integer_dtype_is_refused():
    graph = FG({"a": 1}, [GF.prior("a", [1.0], 1.0)])
    with pytest.raises(TypeError, match="`dtype` must be a real floating dtype"):
        rr.solve_graph(graph, dtype=jnp.int32)
    with pytest.raises(TypeError, match="`dtype`"):
        rr.solve_graph(graph, dtype="not a dtype")


@pytest.mark.parametrize("argument", ["matrix", "target", "precision"])
def test_complex_gaussian_factor_is_refused(argument):
    args = {"matrix": [[1.0]], "target": [1.0], "precision": 1.0}
    args[argument] = np.asarray(args[argument]) * (1 + 1j)
    with pytest.raises(TypeError, match=f"`{argument}` must be real"):
        GF(["a"], args["matrix"], args["target"], args["precision"])
    with pytest.raises(TypeError, match="`mean` must be real"):
        GF.prior("a", [1.0 + 1.0j], 1.0)
    with pytest.raises(TypeError, match="`offset` must be real"):
        GF.between("a", "b", 1.0, [1.0j])


def test_between_a_variable_and_itself_is_refused():
    with pytest.raises(ValueError, match="same variable.*'a'"):
        GF.between("a", "a", 1.0, dim=1)
    with pytest.raises(ValueError, match=r"same variable \('x', index 2, in row 1\)"):
        GF.between(("x", [0, 2]), ("x", [1, 2]), 1.0, dim=2)
    # different variables of one family are fine
    GF.between(("x", [0, 1]), ("x", [1, 2]), 1.0, dim=2)


@pytest.mark.parametrize(
    "linear_solver", [pytest.param("dense", marks=pytest.mark.full), "banded"]
)
def test_float32_graphs_that_do_not_determine_their_answer_are_singular(
    linear_solver,
):
    # float32 least-squares steps go by QR of the residual rows: a variable
    # no factor touches, a zero precision, or a chain with no prior (a free
    # translation) leaves a zero on R's diagonal, as on Cholesky's
    f = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    moves = f(np.ones((7, 2)))
    graphs = [
        FG({"a": 1, "b": 1}, [GF.prior("a", f([1.0]), f(2.0))]),
        FG({"a": 1}, [GF.prior("a", f([1.0]), f(0.0))]),
        FG(
            {"x": (8, 2)},
            [GF.between(("x", range(7)), ("x", range(1, 8)), f(1e4), moves)],
        ),
    ]
    for graph in graphs:
        sol = rr.solve_graph(
            graph, linear_solver=linear_solver, dtype=jnp.float32, throw=False
        )
        assert sol.x.dtype == jnp.float32
        assert sol.result == rr.RESULTS.singular
        assert bool(jnp.all(jnp.isnan(sol.x)))


@pytest.mark.full
def test_a_failed_solve_names_the_graph_and_the_variable():
    graph = FG({"a": 1, "b": 1}, [GF.prior("a", [1.0], 2.0)])
    with pytest.raises(eqx.EquinoxRuntimeError, match="solve_graph.*touches 'b'"):
        rr.solve_graph(graph)
    family = FG({"x": (3, 1)}, [GF.prior(("x", [0, 2]), [1.0], 2.0)])
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"touches 'x'\[1\]"):
        rr.solve_graph(family)


def test_a_nan_target_under_jit_raises_a_graph_message():
    @eqx.filter_jit
    def solve(m):
        return rr.solve_graph(FG({"a": 1}, [GF.prior("a", m, 1.0)])).x

    with pytest.raises(Exception, match="solve_graph: the graph's gradient") as info:
        solve(jnp.array([jnp.nan]))
    assert "data_grad" not in str(info.value)
    sol = rr.solve_graph(FG({"a": 1}, [GF.prior("a", [jnp.nan], 1.0)]), throw=False)
    assert sol.result == rr.RESULTS.nonfinite_iterate


@pytest.mark.parametrize("method", ["auto", "newton"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_a_prior_near_the_dtype_limit_is_solved(dtype, method):
    # its energy overflows at the start, and so did half the squared
    # gradient in Newton's line search (every trial rejected, max_steps in
    # float32); the solve still finds the answer
    prior = GF.prior("a", jnp.array([1e30], dtype), jnp.asarray(1.0, dtype))
    graph = FG({"a": 1}, [prior])
    sol = rr.solve_graph(graph, dtype=dtype, method=method)
    assert sol.result == rr.RESULTS.successful
    np.testing.assert_allclose(sol.x, [1e30], rtol=1e-6)


@pytest.mark.parametrize("method", ["auto", "newton"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_precisions_far_apart_are_solved(dtype, method):
    f = lambda v: jnp.asarray(v, dtype)  # noqa: E731
    graph = FG(
        {"a": 1, "b": 1},
        [
            GF.prior("a", f([1.0]), f(1e30)),
            GF.prior("b", f([2.0]), f(1e-30)),
            GF.between("a", "b", f(1.0), f([0.5])),
        ],
    )
    sol = rr.solve_graph(graph, dtype=dtype, method=method)
    assert sol.result == rr.RESULTS.successful
    # b's own prior is 30 orders weaker than the link to a: b = a + 0.5
    np.testing.assert_allclose(sol.x, [1.0, 1.5], rtol=1e-6)
