"""`graph_laplace`'s marginals by selected inversion: the dense inverse's
blocks (banded and dense solves, mixed variable dimensions, float32 and
float64), under `jit`, `vmap` and `grad`, a compiled program that does not
grow with the graph, and a solution of another graph refused."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.relations as rr
from helpers import assert_close, raises_eagerly_and_under_jit
from retrax.relations._graph_selected_inverse import (
    banded_logdet,
    banded_marginals,
    dense_logdet,
    dense_marginals,
)


def spd(rng, rows, k, scale=1.0):
    a = rng.normal(size=(rows, k, k))
    return scale * (a @ np.swapaxes(a, -1, -2) + k * np.eye(k))


def mixed_graph(poses=80, landmarks=30, dtype=np.float64, seed=0, scale=1.0):
    """Poses `p` (3-d) in a chain, landmarks `l` (2-d) each measured by the
    poses around it through a random linear map: 300 unknowns by default,
    banded (Cuthill-McKee keeps neighbours close), the 2-d landmarks padded
    to 3 in the banded layout."""
    rng = np.random.default_rng(seed)
    f = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    seen = np.arange(poses) * landmarks // poses
    factors = [
        rr.GaussianFactor.prior(("p", [0]), f(np.zeros(3)), f(10.0)),
        rr.GaussianFactor.between(
            ("p", range(poses - 1)),
            ("p", range(1, poses)),
            f(spd(rng, poses - 1, 3, scale)),
            f(rng.normal(size=(poses - 1, 3))),
        ),
        rr.GaussianFactor(
            [("p", range(poses)), ("l", seen)],
            f(rng.normal(size=(poses, 2, 5))),
            f(rng.normal(size=(poses, 2))),
            f(spd(rng, poses, 2)),
        ),
        rr.GaussianFactor.prior(("l", range(landmarks)), f(np.zeros(2)), f(0.1)),
    ]
    return rr.FactorGraph({"p": (poses, 3), "l": (landmarks, 2)}, factors)


def dense_blocks(graph, x):
    """Each variable's block of the inverse of the graph's dense precision,
    by numpy in float64."""
    cov = np.linalg.inv(np.asarray(graph.dense_jacobian(x, "belief"), np.float64))
    out, start = {}, 0
    for name, count, dim, _ in graph.variables:
        idx = start + dim * np.arange(count)[:, None] + np.arange(dim)
        out[name] = cov[idx[:, :, None], idx[:, None, :]]
        start += count * dim
    return out


@pytest.mark.parametrize("linear_solver", ["banded", "dense"])
@pytest.mark.full
def test_marginals_equal_the_dense_inverse(linear_solver):
    graph = mixed_graph()
    assert graph.size == 300
    sol = rr.solve_graph(graph, linear_solver=linear_solver)
    assert sol.result == rr.RESULTS.successful
    if linear_solver == "banded":
        assert graph.banded.count > 20  # many super-blocks: the recurrence runs
    got = rr.graph_laplace(graph, sol)
    ref = dense_blocks(graph, sol.x)
    assert set(got) == {"p", "l"}
    assert got["p"].shape == (80, 3, 3) and got["l"].shape == (30, 2, 2)
    for name in ref:
        assert_close(got[name], ref[name], rtol=1e-9)


@pytest.mark.parametrize("linear_solver", ["banded", "dense"])
@pytest.mark.full
def test_float32_marginals(linear_solver):
    graph = mixed_graph(poses=30, landmarks=10, dtype=np.float32)
    sol = rr.solve_graph(graph, linear_solver=linear_solver, dtype=jnp.float32)
    assert sol.x.dtype == jnp.float32
    got = jax.jit(rr.graph_laplace)(graph, sol)
    ref = dense_blocks(graph, sol.x)
    for name in ref:
        assert got[name].dtype == jnp.float32
        assert_close(got[name], ref[name], rtol=2e-4)


@pytest.mark.parametrize("linear_solver", ["banded", "dense"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.full
def test_free_energy_log_determinant(linear_solver, dtype):
    graph = mixed_graph(poses=30, landmarks=10, dtype=dtype)
    sol = rr.solve_graph(graph, linear_solver=linear_solver, dtype=dtype)
    got = rr.graph_free_energy(graph, sol)
    assert got.dtype == dtype
    x = np.asarray(sol.x, np.float64)
    precision = np.asarray(graph.dense_jacobian(sol.x), np.float64)
    want = (
        float(graph.energy(sol.x))
        + 0.5 * np.linalg.slogdet(precision)[1]
        - 0.5 * x.size * np.log(2 * np.pi)
    )
    np.testing.assert_allclose(got, want, rtol=1e-12 if dtype == np.float64 else 1e-5)


@pytest.mark.full
def test_jit_equals_eager():
    graph = mixed_graph(poses=20, landmarks=6)
    sol = rr.solve_graph(graph)
    eager = rr.graph_laplace(graph, sol)
    jitted = jax.jit(rr.graph_laplace)(graph, sol)
    for name in eager:
        assert_close(jitted[name], eager[name], rtol=1e-13)


@pytest.mark.full
def test_vmap_over_graphs_equals_a_loop():
    scales = jnp.asarray([0.5, 1.0, 2.0])

    def laplace(scale):
        graph = chain_graph(scale)
        return rr.graph_laplace(graph, rr.solve_graph(graph))["x"]

    got = jax.jit(jax.vmap(laplace))(scales)
    for b, scale in enumerate(scales):
        assert_close(got[b], laplace(scale), rtol=1e-12)


def chain_graph(scale, n=16):
    rng = np.random.default_rng(1)
    return rr.FactorGraph(
        {"x": (n, 2)},
        [
            rr.GaussianFactor.prior(("x", [0]), jnp.zeros(2), 1.0),
            rr.GaussianFactor.between(
                ("x", range(n - 1)), ("x", range(1, n)), scale * 4.0, dim=2
            ),
            rr.GaussianFactor(
                [("x", range(n))],
                jnp.eye(2),
                jnp.asarray(rng.normal(size=(n, 2))),
                jnp.asarray([[2.0, 0.3], [0.3, 1.0]]),
            ),
        ],
    )


@pytest.mark.parametrize("linear_solver", ["banded", "dense"])
@pytest.mark.full
def test_derivative_of_a_marginal(linear_solver):
    def variance(scale):
        graph = chain_graph(scale)
        sol = rr.solve_graph(graph, linear_solver=linear_solver)
        return rr.graph_laplace(graph, sol)["x"][7, 0, 0]

    scale, eps = 1.3, 1e-5
    grad = jax.grad(variance)(scale)
    central = (variance(scale + eps) - variance(scale - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, central, rtol=1e-7)
    assert float(grad) < 0  # a stiffer chain is more certain


def hlo_ops(graph):
    sol = rr.solve_graph(graph)
    text = jax.jit(rr.graph_laplace).lower(graph, sol).as_text()
    return sum(1 for line in text.splitlines() if " = " in line)


@pytest.mark.full
def test_program_does_not_grow_with_the_graph():
    small, large = mixed_graph(40, 15), mixed_graph(400, 150)
    assert small.banded.count < large.banded.count
    assert hlo_ops(small) == hlo_ops(large)


def test_assembly_program_does_not_grow_with_the_graph():
    def ops(graph):
        x = jnp.zeros(graph.size)

        def assemble(graph, x):
            return (
                graph.gradient(x),
                graph.energy(x),
                graph.dense_jacobian(x),
                graph.banded_jacobian(x),
            )

        text = jax.jit(assemble).lower(graph, x).as_text()
        return sum(1 for line in text.splitlines() if " = " in line)

    assert ops(mixed_graph(40, 15)) == ops(mixed_graph(400, 150))


@pytest.mark.full
def test_banded_order_of_a_shuffled_chain():
    # A chain whose variables are numbered at random, with a short loop every
    # tenth variable: Cuthill-McKee finds the chain's order (bandwidth 2).
    n = 200
    perm = np.random.default_rng(3).permutation(n)
    loops = np.arange(0, n - 2, 10)
    graph = rr.FactorGraph(
        {"x": (n, 2)},
        [
            rr.GaussianFactor.prior(("x", [0]), jnp.zeros(2), 1.0),
            rr.GaussianFactor.between(("x", perm[:-1]), ("x", perm[1:]), 1.0, dim=2),
            rr.GaussianFactor.between(
                ("x", perm[loops]), ("x", perm[loops + 2]), 1.0, dim=2
            ),
        ],
    )
    band = graph.banded
    assert band.size == 2 * 2 and band.count == n // 2
    padded = np.sort(np.concatenate([band.padded, band.pads]))
    np.testing.assert_array_equal(padded, np.arange(band.count * band.size))
    sol = rr.solve_graph(graph, linear_solver="banded")
    got = rr.graph_laplace(graph, sol)
    ref = dense_blocks(graph, sol.x)
    assert_close(got["x"], ref["x"], rtol=1e-9)


@pytest.mark.full
def test_not_positive_definite_is_nan_and_reported():
    bands = np.zeros((5, 3, 2, 2))
    bands[:, 1] = np.eye(2)
    bands[2, 1] = [[1.0, 0.0], [0.0, -1.0]]
    padded = np.arange(10)
    start, dim = np.arange(5) * 2, np.full(5, 2)
    covs, ok = banded_marginals(jnp.asarray(bands), padded, start, dim)
    assert not bool(ok) and bool(jnp.all(jnp.isnan(covs[2:])))
    matrix = np.eye(10)
    matrix[4, 4] = -1.0
    covs, ok = dense_marginals(jnp.asarray(matrix), start, dim)
    assert not bool(ok) and bool(jnp.all(jnp.isnan(covs)))
    for logdet, ok in (
        banded_logdet(jnp.asarray(bands)),
        dense_logdet(jnp.asarray(matrix)),
    ):
        assert not bool(ok) and bool(jnp.isnan(logdet))
    bands[2, 1] = np.eye(2)
    covs, ok = banded_marginals(jnp.asarray(bands), padded, start, dim)
    assert bool(ok)
    assert_close(covs, np.broadcast_to(np.eye(2), (5, 2, 2)), rtol=1e-15)


@pytest.mark.loud
def test_a_solution_of_another_graph_is_refused():
    g1 = chain_graph(1.0)
    sol = rr.solve_graph(g1)
    renamed = rr.FactorGraph(
        {"y": (16, 2)},
        [rr.GaussianFactor.prior(("y", range(16)), jnp.zeros(2), 1.0)],
    )
    regrouped = rr.FactorGraph(
        {"x": (8, 2), "z": (8, 2)},
        [
            rr.GaussianFactor.prior(("x", range(8)), jnp.zeros(2), 1.0),
            rr.GaussianFactor.prior(("z", range(8)), jnp.zeros(2), 1.0),
        ],
    )
    for other in (renamed, regrouped):
        assert other.size == g1.size
        for query in (rr.graph_laplace, rr.graph_free_energy):
            raises_eagerly_and_under_jit(
                query, other, sol, match="`sol` is the solution of another graph"
            )


def _bench_graph_laplace():
    path = pathlib.Path(__file__).parents[2] / "benchmarks" / "bench_graph_laplace.py"
    spec = importlib.util.spec_from_file_location("bench_graph_laplace", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.parametrize("linear_solver", ["banded", "dense"])
@pytest.mark.full
def test_gauss_newton_curvature_inverts_the_residuals_linearisation(linear_solver):
    # On a nonlinear Pose2 graph (ResidualFactor rows) the two curvatures
    # differ by the residuals' curvature; "gauss_newton" inverts J_r^T J_r
    # (GTSAM's Marginals' precision), "hessian" the energy's Hessian.
    bench = _bench_graph_laplace()
    problem = bench.pose2_problem(40, span=3, every=10)
    graph = bench.retrax_graph(problem)
    sol = rr.solve_graph(graph, {"x": problem[0]}, linear_solver=linear_solver)
    assert sol.result == rr.RESULTS.successful
    gauss_newton = rr.graph_laplace(graph, sol, curvature="gauss_newton")["x"]
    hessian = rr.graph_laplace(graph, sol)["x"]
    precision = np.asarray(graph.dense_jacobian(sol.x, "precision"), np.float64)
    cov = np.linalg.inv(precision)
    idx = 3 * np.arange(40)[:, None] + np.arange(3)
    assert_close(gauss_newton, cov[idx[:, :, None], idx[:, None, :]], rtol=1e-9)
    assert_close(hessian, dense_blocks(graph, sol.x)["x"], rtol=1e-9)
    assert not np.allclose(gauss_newton, hessian, rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="`curvature` must be"):
        rr.graph_laplace(graph, sol, curvature="gn")


@pytest.mark.slow
def test_pose2_marginals_against_gtsam():
    # The benchmark's Pose2 graph (ResidualFactor rows, nonlinear) at
    # retrax's MAP point. graph_laplace equals the dense inverse of the
    # energy's Hessian; GTSAM's Marginals (an optional peer), rotated into
    # global coordinates, equal the dense inverse of the Gauss-Newton
    # precision $J_r^T J_r$ (GTSAM's linearisation). The two references differ
    # by the residuals' curvature (about 1e-3 relative here).
    gtsam = pytest.importorskip("gtsam")
    del gtsam
    path = pathlib.Path(__file__).parents[2] / "benchmarks" / "bench_graph_laplace.py"
    spec = importlib.util.spec_from_file_location("bench_graph_laplace", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    problem = bench.pose2_problem(120, span=3, every=20)
    graph = bench.retrax_graph(problem)
    sol = rr.solve_graph(graph, {"x": problem[0]})
    assert sol.result == rr.RESULTS.successful
    got = rr.graph_laplace(graph, sol)["x"]
    assert_close(got, dense_blocks(graph, sol.x)["x"], rtol=1e-9)
    ref, _ = bench.gtsam_marginals(problem, np.asarray(sol.value["x"]))
    gauss_newton = np.linalg.inv(np.asarray(graph.dense_jacobian(sol.x, "precision")))
    idx = 3 * np.arange(len(ref))[:, None] + np.arange(3)
    assert_close(gauss_newton[idx[:, :, None], idx[:, None, :]], ref, rtol=1e-8)
    # and graph_laplace gives GTSAM's Marginals with its curvature
    ours = rr.graph_laplace(graph, sol, curvature="gauss_newton")["x"]
    assert_close(ours, ref, rtol=1e-8)
