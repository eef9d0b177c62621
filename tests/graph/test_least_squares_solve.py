"""Gauss–Newton and Levenberg–Marquardt solves of graphs of residual factors:
answers against scipy's least squares and closed forms, the step counts of
a Pose2 pose graph, derivatives against central differences, the `method`
argument, and float32 chains beyond float32's normal equations (the steps by
QR of the residual rows against the normal equations' solution)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import retrax.relations as rr
from retrax.relations._graph_system import gauss_newton_system


sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

import factor_graph  # noqa: E402
import pose2_graph  # noqa: E402


def _scipy_reference(graph, x0):
    """The graph's minimum by scipy's trust-region least squares on the
    stacked residuals of its factors (their rows, each factor's function
    evaluated here row by row), started at `x0`, to scipy's tightest
    tolerances."""

    def residuals(x):
        x = jnp.asarray(x)
        out = []
        for k, f in enumerate(graph.factors):
            xs = tuple(x[idx] for idx in graph.layout.coords[k])
            if isinstance(f, rr.GaussianFactor):
                a, b, p = f.rows()
                r = jnp.einsum("rkd,rd->rk", a, jnp.concatenate(xs, axis=1)) - b
                chol = jnp.linalg.cholesky(p)
                out.append(jnp.einsum("rkj,rk->rj", chol, r).reshape(-1))
            else:
                rows = f.rows()
                r = jax.vmap(lambda row, *v, f=f: f.residual(f.params, row, *v))(
                    rows, *xs
                )
                out.append(r.reshape(-1))
        return jnp.concatenate(out)

    fun = jax.jit(residuals)
    jac = jax.jit(jax.jacfwd(residuals))
    found = scipy.optimize.least_squares(
        lambda x: np.asarray(fun(x)),
        np.asarray(x0),
        jac=lambda x: np.asarray(jac(x)),
        method="trf",
        xtol=1e-15,
        ftol=1e-15,
        gtol=1e-15,
    )
    return found.x


@pytest.fixture(scope="module")
def small_pose2():
    problem = pose2_graph.pose2_problem(poses=40, closures=4, seed=3)
    graph = pose2_graph.pose2_graph(problem)
    init = {"x": jnp.asarray(pose2_graph.dead_reckoning(problem))}
    return problem, graph, init


def _angle_wrapped(a):
    a = np.asarray(a).reshape(-1, 3).copy()
    a[:, 2] = np.arctan2(np.sin(a[:, 2]), np.cos(a[:, 2]))
    return a


@pytest.mark.parametrize("method", ["levenberg_marquardt", "gauss_newton", "newton"])
@pytest.mark.full
def test_pose2_graph_matches_scipy_least_squares(small_pose2, method):
    _, graph, init = small_pose2
    x0 = graph.flatten(init)
    ref = _scipy_reference(graph, x0)
    sol = rr.solve_graph(graph, init, method=method)
    assert sol.result == rr.RESULTS.successful and bool(sol.stable)
    np.testing.assert_allclose(
        _angle_wrapped(sol.x), _angle_wrapped(ref), rtol=0, atol=1e-8
    )
    np.testing.assert_allclose(sol.gradient, 0, atol=1e-6)


@pytest.mark.full
def test_pose2_graph_steps_and_stats(small_pose2):
    _, graph, init = small_pose2
    sol = rr.solve_graph(graph, init)  # "auto": Levenberg-Marquardt
    assert set(sol.stats) == {
        "num_steps",
        "num_accepted",
        "max_step",
        "cost",
        "damping",
    }
    # from dead reckoning, as GTSAM's LM (4-6 iterations on such graphs)
    assert int(sol.stats["num_steps"]) <= 10
    assert int(sol.stats["num_accepted"]) <= int(sol.stats["num_steps"])
    x = sol.x
    np.testing.assert_allclose(sol.stats["cost"], graph.energy(x), rtol=1e-12)


def test_pose2_chain_without_closures():
    # `--closures 0`: odometry and the prior alone (the closures' index pairs
    # were built as floats and the example stopped with an IndexError)
    problem = pose2_graph.pose2_problem(poses=12, closures=0)
    assert problem.closures.shape == (0, 2) and problem.closures.dtype == np.int64
    start = pose2_graph.dead_reckoning(problem)
    sol = rr.solve_graph(pose2_graph.pose2_graph(problem), {"x": jnp.asarray(start)})
    # without closures the chain's answer is dead reckoning itself
    np.testing.assert_allclose(sol.value["x"], start, atol=1e-8)


def test_levenberg_marquardt_where_gauss_newton_overshoots():
    # Rosenbrock's residuals (10 (y - x^2), 1 - x) from a far start: the
    # minimum is (1, 1) exactly
    def residual(_, __, p):
        return jnp.stack([10 * (p[1] - p[0] ** 2), 1 - p[0]])

    graph = rr.FactorGraph({"p": 2}, [rr.ResidualFactor(["p"], residual)])
    init = {"p": jnp.array([-3.0, -4.0])}
    sol = rr.solve_graph(graph, init, method="levenberg_marquardt")
    assert sol.result == rr.RESULTS.successful
    np.testing.assert_allclose(sol.value["p"], [1.0, 1.0], rtol=0, atol=1e-10)
    # the damped solve took some steps back: its count says so
    assert int(sol.stats["num_accepted"]) <= int(sol.stats["num_steps"])


def _linear_chain(meas, smooth):
    n = meas.shape[0]
    return rr.FactorGraph(
        {"x": (n, 2)},
        [
            rr.GaussianFactor.prior(("x", [0]), jnp.zeros(2), 1.0),
            rr.GaussianFactor.between(
                ("x", range(n - 1)), ("x", range(1, n)), smooth, dim=2
            ),
            rr.GaussianFactor([("x", range(n))], jnp.eye(2), meas, 2.0),
        ],
    )


@pytest.mark.parametrize("method", ["levenberg_marquardt", "gauss_newton"])
@pytest.mark.parametrize("linear_solver", ["dense", "banded"])
@pytest.mark.full
def test_linear_gaussian_graph_in_one_step(method, linear_solver):
    meas = jnp.asarray(np.random.default_rng(1).normal(size=(10, 2)))
    graph = _linear_chain(meas, 3.0)
    zero = jnp.zeros(graph.size)
    precision = np.asarray(graph.dense_jacobian(zero))
    mean = np.linalg.solve(precision, -np.asarray(graph.gradient(zero)))
    sol = rr.solve_graph(graph, method=method, linear_solver=linear_solver)
    assert sol.result == rr.RESULTS.successful
    np.testing.assert_allclose(sol.x, mean, rtol=0, atol=1e-12)
    # one Gauss-Newton step is exact; the second only confirms it
    assert int(sol.stats["num_accepted"]) == 2


@pytest.mark.full
def test_implicit_derivatives_of_a_least_squares_solve(small_pose2):
    problem, _, init = small_pose2

    def answer(odometry):
        graph = pose2_graph.pose2_graph(problem._replace(odometry=odometry))
        return rr.solve_graph(graph, init).x

    def loss(odometry):
        x = answer(odometry)
        return jnp.sum(jnp.sin(x) * jnp.arange(x.size, dtype=x.dtype))

    odometry = jnp.asarray(problem.odometry)
    direction = jnp.asarray(np.random.default_rng(2).normal(size=odometry.shape))
    eps = 1e-6
    central = (loss(odometry + eps * direction) - loss(odometry - eps * direction)) / (
        2 * eps
    )
    grad = jax.grad(loss)(odometry)
    np.testing.assert_allclose(jnp.sum(grad * direction), central, rtol=1e-6)
    _, tangent = jax.jvp(loss, (odometry,), (direction,))
    np.testing.assert_allclose(tangent, central, rtol=1e-6)


def test_vmap_of_levenberg_marquardt_equals_a_loop():
    def residual(_, target, p):
        return jnp.stack([10 * (p[1] - p[0] ** 2), target[0] - p[0]])

    targets = jnp.array([[1.0], [0.5], [-1.5]])

    def solve(t):
        factor = rr.ResidualFactor([("p", [0])], residual, None, t[None])
        graph = rr.FactorGraph({"p": (1, 2)}, [factor])
        return rr.solve_graph(graph, {"p": jnp.array([[-2.0, 3.0]])}).x

    batched = jax.vmap(solve)(targets)
    looped = jnp.stack([solve(t) for t in targets])
    np.testing.assert_allclose(batched, looped, rtol=0, atol=1e-12)
    # the closed form: p = (t, t^2)
    np.testing.assert_allclose(
        batched, jnp.concatenate([targets, targets**2], axis=1), atol=1e-10
    )


@pytest.mark.full
def test_float32_pose2_graph(small_pose2):
    problem, graph64, init = small_pose2
    graph = pose2_graph.pose2_graph(problem, dtype=jnp.float32)
    init32 = {"x": init["x"].astype(jnp.float32)}
    sol = rr.solve_graph(graph, init32)
    assert sol.x.dtype == jnp.float32
    assert sol.result == rr.RESULTS.successful
    ref = rr.solve_graph(graph64, init).x
    scale = float(jnp.max(jnp.abs(ref)))
    np.testing.assert_allclose(
        _angle_wrapped(sol.x), _angle_wrapped(ref), rtol=0, atol=1e-4 * scale
    )


@pytest.mark.loud
def test_method_is_checked(small_pose2):
    _, graph, init = small_pose2
    with pytest.raises(ValueError, match="`method`"):
        rr.solve_graph(graph, init, method="lm")
    with pytest.raises(ValueError, match="`method`"):
        rr.solve_graph(graph, init, method="Gauss-Newton")


@pytest.mark.loud
@pytest.mark.full
def test_least_squares_methods_need_residual_factors():
    r1, _, _ = factor_graph.graph()
    relation = rr.RelationFactor(r1, {"a": "a"}, {"b": jnp.zeros(1)})
    graph = rr.FactorGraph({"a": 1}, [relation])
    for method in ("gauss_newton", "levenberg_marquardt"):
        with pytest.raises(ValueError, match="RelationFactor"):
            rr.solve_graph(graph, method=method)


def _odometry_chain(poses, link, prior, dtype, seed=0):
    """Dead reckoning as a graph: planar poses, a prior on the first and an
    odometry link between neighbours; its answer is the running sum of the
    moves (exactly, in float64, from the moves as stored)."""
    rng = np.random.default_rng(seed)
    heading = np.cumsum(0.05 * rng.standard_normal(poses - 1))
    moves = (0.1 * np.stack([np.cos(heading), np.sin(heading)], -1)).astype(dtype)
    graph = rr.FactorGraph(
        {"p": (poses, 2)},
        [
            rr.GaussianFactor.prior(("p", [0]), np.zeros(2, dtype), dtype(prior)),
            rr.GaussianFactor.between(
                ("p", range(poses - 1)), ("p", range(1, poses)), dtype(link), moves
            ),
        ],
    )
    answer = np.concatenate([np.zeros((1, 2)), np.cumsum(moves.astype(np.float64), 0)])
    return graph, answer.reshape(-1)


@pytest.mark.parametrize(
    "linear_solver", [pytest.param("dense", marks=pytest.mark.full), "banded"]
)
def test_float32_chain_beyond_float32_normal_equations(linear_solver):
    # the Gauss-Newton matrix's condition number (~1e12) is far beyond
    # 1/eps of float32: block Cholesky of it gave NaN steps (12 steps, then
    # a failed linear solve); the steps by QR of the residual rows solve the
    # chain in float32 as float64 does, in two steps
    graph, answer = _odometry_chain(100, 1e6, 1e-2, np.float32)
    sol = rr.solve_graph(graph, linear_solver=linear_solver, dtype=jnp.float32)
    assert sol.x.dtype == jnp.float32
    assert sol.result == rr.RESULTS.successful
    assert int(sol.stats["num_steps"]) <= 2
    scale = float(np.max(np.abs(answer)))
    np.testing.assert_allclose(sol.x, answer, rtol=0, atol=1e-6 * scale)


@pytest.mark.full
def test_float32_chain_of_40000_poses_in_three_steps():
    # an odometry chain of 40,000 poses: cond(J^T J) ~ 1e9 in float32 (it
    # reached max_steps); float64 takes two steps, float32 at most three
    graph, answer = _odometry_chain(40_000, 1e4, 1e4, np.float32)
    sol = rr.solve_graph(graph, dtype=jnp.float32)
    assert sol.x.dtype == jnp.float32
    assert sol.result == rr.RESULTS.successful
    assert int(sol.stats["num_steps"]) <= 3
    scale = float(np.max(np.abs(answer)))
    np.testing.assert_allclose(sol.x, answer, rtol=0, atol=1e-6 * scale)
    graph64, _ = _odometry_chain(40_000, 1e4, 1e4, np.float64)
    assert int(rr.solve_graph(graph64).stats["num_steps"]) == 2


def _residual_graph(closures):
    """3-d poses in a chain (`closures` links from pose 0 further on widen
    the band), 2-d landmarks (padded to 3 in the banded layout) seen through
    random linear maps with full precisions (one of them 0), 30 rows on one
    landmark (several chunks of rows in its block) and a nonlinear residual
    on every pose."""
    rng = np.random.default_rng(4)
    n, k = 12, 4
    seen = np.arange(n) * k // n
    a = rng.normal(size=(n, 3, 3))
    precision = a @ np.swapaxes(a, -1, -2) / 3 + 0.1 * np.eye(3)
    observed = rng.normal(size=(n, 2, 2))
    observed = observed @ np.swapaxes(observed, -1, -2) + np.eye(2)
    observed[5] = 0.0

    def residual(_, data, p):
        return jnp.stack([jnp.sin(p[0]) - data[0], p[1] * p[2] - data[1]])

    factors = [
        rr.GaussianFactor.prior(("p", [0]), jnp.zeros(3), 4.0),
        rr.GaussianFactor.between(
            ("p", range(n - 1)),
            ("p", range(1, n)),
            precision[:-1],
            rng.normal(size=(n - 1, 3)),
        ),
        rr.GaussianFactor(
            [("p", range(n)), ("l", seen)],
            rng.normal(size=(n, 2, 5)),
            rng.normal(size=(n, 2)),
            observed,
        ),
        rr.GaussianFactor(
            [("l", np.zeros(30, int))],
            rng.normal(size=(30, 1, 2)),
            rng.normal(size=(30, 1)),
            1.0,
        ),
        rr.GaussianFactor.prior(("l", range(1, k)), jnp.zeros(2), 0.5),
        rr.ResidualFactor([("p", range(n))], residual, None, rng.normal(size=(n, 2))),
    ]
    for far in range(2, 2 + closures):
        factors.append(rr.GaussianFactor.between(("p", [0]), ("p", [far]), 1.0, dim=3))
    return rr.FactorGraph({"p": (n, 3), "l": (k, 2)}, factors)


@pytest.mark.parametrize(
    ("closures", "linear_solver"),
    [
        (0, "banded"),
        (3, "dense"),
        pytest.param(3, "banded", marks=pytest.mark.full),
        pytest.param(0, "dense", marks=pytest.mark.full),
    ],
)
def test_square_root_steps_solve_the_normal_equations(closures, linear_solver):
    # in float64 the QR steps equal the damped normal equations' solution,
    # for narrow blocks (Givens rotations) and wide ones (Householder)
    graph = _residual_graph(closures)
    assert (graph.banded.size > 6) == (closures > 0)
    assert len(graph.banded.pads) > 0
    x = jnp.asarray(np.random.default_rng(5).normal(size=graph.size))
    gn = np.asarray(graph.dense_jacobian(x, "precision"))
    g = np.asarray(graph.gradient(x))
    d = np.random.default_rng(6).uniform(0.5, 2.0, size=graph.size)
    rhs = np.random.default_rng(7).normal(size=graph.size)

    @jax.jit
    def factorised(damping):
        system = gauss_newton_system(graph, x, linear_solver, square_root=True)
        trial = system.add_diagonal(damping)
        step, result = trial.step()
        positive, logdet = trial.symmetric_logdet()
        solved = trial.solve(jnp.asarray(rhs))
        return system.diagonal(), step, result, solved, positive, logdet

    for damping in (np.zeros_like(d), d):
        diagonal, step, result, solved, positive, logdet = factorised(damping)
        matrix = gn + np.diag(damping)
        np.testing.assert_allclose(diagonal, np.diag(gn), rtol=1e-12)
        assert result == rr.RESULTS.successful and bool(positive)
        np.testing.assert_allclose(step, np.linalg.solve(matrix, -g), rtol=1e-9)
        np.testing.assert_allclose(solved, np.linalg.solve(matrix, rhs), rtol=1e-9)
        np.testing.assert_allclose(logdet, np.linalg.slogdet(matrix)[1], rtol=1e-10)
