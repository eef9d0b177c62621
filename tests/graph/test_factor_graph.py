"""The factor-graph engine: the joint solve and belief propagation against the
exact Gaussian posterior, implicit derivatives against central differences,
batching, float32 and the errors."""

import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
import retrax.relations as rr


sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

import factor_graph as example  # noqa: E402

import retrax


N = 12
MEAS_PRECISION = np.array([[2.0, 0.3], [0.3, 1.0]])


def chain(meas, loop=False, smooth=4.0):
    """A chain of N 2-d variables: a prior on the first, smoothness between
    neighbours, a measurement of each; `loop` adds a loop closure."""
    factors = [
        rr.GaussianFactor.prior(("x", [0]), jnp.zeros(2), 1.0),
        rr.GaussianFactor.between(
            ("x", range(N - 1)), ("x", range(1, N)), smooth, dim=2
        ),
        rr.GaussianFactor([("x", range(N))], jnp.eye(2), meas, MEAS_PRECISION),
    ]
    if loop:
        factors.append(
            rr.GaussianFactor.between(("x", [N - 1]), ("x", [0]), 1.0, dim=2)
        )
    return rr.FactorGraph({"x": (N, 2)}, factors)


def exact(graph):
    """The Gaussian posterior of a linear-Gaussian graph, by dense algebra."""
    zero = jnp.zeros(graph.size)
    precision = graph.dense_jacobian(zero)
    mean = jnp.linalg.solve(precision, -graph.gradient(zero))
    return mean, jnp.linalg.inv(precision)


def blocks(cov, d=2):
    return jnp.stack([cov[d * i : d * i + d, d * i : d * i + d] for i in range(N)])


@pytest.fixture
def meas():
    return jnp.asarray(np.random.default_rng(0).normal(size=(N, 2)))


@pytest.mark.parametrize("loop", [False, True])
@pytest.mark.parametrize("linear_solver", ["dense", "banded"])
def test_joint_solve_is_the_exact_posterior(meas, loop, linear_solver):
    graph = chain(meas, loop)
    mean, cov = exact(graph)
    sol = rr.solve_graph(graph, linear_solver=linear_solver)
    assert sol.result == rr.RESULTS.successful
    assert sol.linear_solver == linear_solver
    np.testing.assert_allclose(sol.x, mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(sol.value["x"], mean.reshape(N, 2), rtol=0, atol=1e-10)
    with pytest.warns(DeprecationWarning, match=r"GraphSolution\.values"):
        assert sol.values is sol.value
    np.testing.assert_allclose(
        rr.graph_laplace(graph, sol)["x"], blocks(cov), atol=1e-10
    )


@pytest.mark.parametrize("schedule", ["flooding", "sequential"])
def test_propagation_is_exact_on_a_tree(meas, schedule):
    graph = chain(meas)
    mean, cov = exact(graph)
    sol = rr.propagate_beliefs(graph, schedule=schedule)
    assert sol.result == rr.RESULTS.successful
    np.testing.assert_allclose(sol.x, mean, atol=1e-10)
    np.testing.assert_allclose(sol.covariances["x"], blocks(cov), atol=1e-10)
    assert sol.stats["change"]["x"].shape == (N,)
    if schedule == "sequential":
        # exact after one forward-backward pass; the second confirms it
        assert int(sol.stats["num_steps"]) <= 3


@pytest.mark.parametrize(
    "schedule, damping", [("flooding", 0.0), ("flooding", 0.3), ("sequential", 0.0)]
)
def test_loopy_propagation_converges_to_the_exact_means(meas, schedule, damping):
    graph = chain(meas, loop=True)
    mean, cov = exact(graph)
    sol = rr.propagate_beliefs(
        graph, schedule=schedule, damping=damping, tol=1e-13, max_steps=500
    )
    assert sol.result == rr.RESULTS.successful
    np.testing.assert_allclose(sol.x, mean, atol=1e-10)
    # loopy variances are approximations, but close on this graph
    np.testing.assert_allclose(sol.covariances["x"], blocks(cov), atol=5e-3)


@pytest.mark.slow
def test_learned_relations_in_a_graph_match_the_exact_posterior():
    r1, r2, _ = example.graph()
    graph = rr.FactorGraph(
        {"a": 1, "b": 1, "c": 1},
        [
            rr.RelationFactor(r1, {"a": "a", "b": "b"}),
            rr.RelationFactor(r2, {"b": "b", "c": "c"}),
            rr.GaussianFactor(["c"], [[example.H]], [example.Y], 1 / example.NOISE**2),
        ],
    )
    mean, cov = exact(graph)
    sol = rr.solve_graph(graph)
    np.testing.assert_allclose(sol.x, mean, atol=1e-10)
    laplace = rr.graph_laplace(graph, sol)
    np.testing.assert_allclose(
        [laplace[k][0, 0] for k in "abc"], jnp.diag(cov), atol=1e-10
    )
    bp = rr.propagate_beliefs(graph)
    np.testing.assert_allclose(bp.x, mean, atol=1e-10)
    # the hand-written message loop of the example agrees
    beliefs, _ = example.pass_messages(r1, r2, example.graph()[2])
    np.testing.assert_allclose([beliefs[k].mean[0] for k in "abc"], mean, atol=1e-10)


def test_relation_factor_with_an_observed_channel():
    r1, _, _ = example.graph()
    graph = rr.FactorGraph({"b": 1}, [rr.RelationFactor(r1, {"b": "b"}, {"a": 0.7})])
    sol = rr.solve_graph(graph)
    # the conditional of N(m, P^-1) given a: m_b - P_bb^-1 P_ba (a - m_a)
    p, m = np.array([[2.0, 1.2], [1.2, 1.5]]), np.array([0.5, -0.3])
    np.testing.assert_allclose(
        sol.value["b"], [m[1] - p[1, 0] / p[1, 1] * (0.7 - m[0])], atol=1e-10
    )


def range_graph(anchors, ranges, sd):
    """2-d localisation of two points from ranges to anchors, tied together."""

    def residual(params, row, x):
        anchor, r = row
        return (jnp.linalg.norm(x - anchor) - r) / params

    return rr.FactorGraph(
        {"p": (2, 2)},
        [
            rr.ResidualFactor(
                [("p", [0, 0, 0, 1, 1, 1])],
                residual,
                jnp.asarray(sd),
                (anchors, ranges),
            ),
            rr.GaussianFactor.between(
                ("p", [0]), ("p", [1]), 10.0, jnp.array([1.0, 0.0])
            ),
        ],
    )


def test_nonlinear_residuals_joint_and_propagation_agree():
    anchors = jnp.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]] * 2)
    truth = jnp.array([[1.0, 1.0]] * 3 + [[2.0, 1.0]] * 3)
    ranges = jnp.linalg.norm(truth - anchors, axis=1) + 0.01 * jnp.arange(6.0)
    graph = range_graph(anchors, ranges, 0.1)
    init = {"p": jnp.array([[0.5, 0.5], [2.5, 0.5]])}
    sol = rr.solve_graph(graph, init)
    assert sol.result == rr.RESULTS.successful and bool(sol.stable)
    np.testing.assert_allclose(sol.gradient, 0, atol=1e-8)
    bp = rr.propagate_beliefs(graph, init, tol=1e-12, max_steps=300)
    np.testing.assert_allclose(bp.x, sol.x, atol=1e-8)


@pytest.mark.parametrize("linear_solver", ["dense", "banded"])
@pytest.mark.full
def test_float32_jacobians_reach_the_same_root(linear_solver):
    # Newton's matrix in float32, the gradient and the test in float64: the
    # same root to the tolerance, and the same implicit derivatives (those
    # use the exact float64 Jacobian at the root)
    anchors = jnp.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]] * 2)
    truth = jnp.array([[1.0, 1.0]] * 3 + [[2.0, 1.0]] * 3)
    ranges = jnp.linalg.norm(truth - anchors, axis=1) + 0.01 * jnp.arange(6.0)
    init = {"p": jnp.array([[0.5, 0.5], [2.5, 0.5]])}

    def solve(ranges, jacobian_dtype):
        graph = range_graph(anchors, ranges, 0.1)
        return rr.solve_graph(
            graph, init, linear_solver=linear_solver, jacobian_dtype=jacobian_dtype
        )

    exact = solve(ranges, None)
    mixed = solve(ranges, jnp.float32)
    assert mixed.result == rr.RESULTS.successful and bool(mixed.stable)
    assert mixed.x.dtype == jnp.float64
    np.testing.assert_allclose(mixed.x, exact.x, rtol=0, atol=1e-9)
    np.testing.assert_allclose(mixed.gradient, 0, atol=1e-8)
    grad = jax.grad(lambda r, d: jnp.sum(jnp.sin(solve(r, d).x)))
    np.testing.assert_allclose(
        grad(ranges, jnp.float32), grad(ranges, None), rtol=1e-12, atol=1e-14
    )
    # the solve's own dtype is the default's path
    same = solve(ranges, jnp.float64)
    np.testing.assert_array_equal(same.x, exact.x)


def loss_of(meas, smooth, precision_scale):
    factors = [
        rr.GaussianFactor.prior(("x", [0]), jnp.zeros(2), 1.0),
        rr.GaussianFactor.between(
            ("x", range(N - 1)), ("x", range(1, N)), smooth, dim=2
        ),
        rr.GaussianFactor(
            [("x", range(N))], jnp.eye(2), meas, precision_scale * MEAS_PRECISION
        ),
    ]
    graph = rr.FactorGraph({"x": (N, 2)}, factors)
    sol = rr.solve_graph(graph, linear_solver="banded")
    return jnp.sum(jnp.sin(sol.x) * jnp.arange(1.0, 2 * N + 1))


def central(f, x, eps=1e-6):
    return (f(x + eps) - f(x - eps)) / (2 * eps)


@pytest.mark.full
def test_gradients_by_the_implicit_function_theorem(meas):
    smooth, scale = jnp.asarray(4.0), jnp.asarray(1.5)
    g_meas, g_smooth, g_scale = jax.grad(loss_of, argnums=(0, 1, 2))(
        meas, smooth, scale
    )
    e = jnp.zeros_like(meas).at[3, 1].set(1.0)
    np.testing.assert_allclose(
        g_meas[3, 1],
        central(lambda t: loss_of(meas + t * e, smooth, scale), 0.0),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        g_smooth, central(lambda s: loss_of(meas, s, scale), smooth), rtol=1e-6
    )
    np.testing.assert_allclose(
        g_scale, central(lambda s: loss_of(meas, smooth, s), scale), rtol=1e-6
    )
    # forward mode gives the same directional derivative
    _, tangent = jax.jvp(lambda m: loss_of(m, smooth, scale), (meas,), (e,))
    np.testing.assert_allclose(tangent, g_meas[3, 1], rtol=1e-10)


@pytest.mark.full
def test_relation_parameter_gradient():
    r1, r2, _ = example.graph()

    def loss(r1):
        graph = rr.FactorGraph(
            {"a": 1, "b": 1, "c": 1},
            [
                rr.RelationFactor(r1, {"a": "a", "b": "b"}),
                rr.RelationFactor(r2, {"b": "b", "c": "c"}),
                rr.GaussianFactor(["c"], [[2.0]], [1.1], 10.0),
            ],
        )
        return jnp.sum(rr.solve_graph(graph).x ** 2)

    grads = eqx.filter_grad(loss)(r1)
    mean_of = lambda f: f.relation.pred.net.mean  # noqa: E731
    got = mean_of(grads)
    for i in range(2):
        bumped = lambda t, i=i: loss(  # noqa: E731
            eqx.tree_at(mean_of, r1, mean_of(r1).at[i].add(t))
        )
        np.testing.assert_allclose(got[i], central(bumped, 0.0), rtol=1e-6)


@pytest.mark.full
def test_vmap_over_measurements_equals_a_loop(meas):
    batch = meas[None] + jnp.arange(4.0)[:, None, None]

    @jax.jit
    @jax.vmap
    def solve(m):
        return rr.solve_graph(chain(m)).x

    got = solve(batch)
    for b in range(4):
        np.testing.assert_allclose(got[b], exact(chain(batch[b]))[0], atol=1e-10)


@pytest.mark.full
def test_free_energy_of_a_gaussian_graph(meas):
    graph = chain(meas)
    sol = rr.solve_graph(graph)
    zero = jnp.zeros(graph.size)
    precision = graph.dense_jacobian(zero)
    mean = jnp.linalg.solve(precision, -graph.gradient(zero))
    # -log of the integral of exp(-E): E(mean) + 0.5 log det P - n/2 log 2 pi
    want = (
        graph.energy(mean)
        + 0.5 * jnp.linalg.slogdet(precision)[1]
        - 0.5 * graph.size * np.log(2 * np.pi)
    )
    np.testing.assert_allclose(rr.graph_free_energy(graph, sol), want, rtol=1e-12)

    def free(smooth):
        g = chain(meas, smooth=smooth)
        return rr.graph_free_energy(g, rr.solve_graph(g))

    np.testing.assert_allclose(jax.grad(free)(4.0), central(free, 4.0), rtol=1e-6)


def test_free_energy_needs_a_conservative_relation(getkey):
    model = rd.TimeMLP(2, hidden=8, depth=1, key=getkey())
    relation = rr.ImplicitDiffusion(
        rd.NoisePredictor(model, rd.VPSDE()), rr.field_nodes(getkey(), 2)
    )
    factor = rr.Factor(relation, {"u": 1, "v": 1})
    graph = rr.FactorGraph(
        {"u": 1},
        [
            rr.RelationFactor(factor, {"u": "u"}, {"v": 0.3}),
            rr.GaussianFactor.prior("u", [0.0], 1.0),
        ],
    )
    sol = rr.solve_graph(graph, throw=False)
    with pytest.raises(TypeError, match="not conservative"):
        rr.graph_free_energy(graph, sol)


def test_a_solve_that_does_not_converge_is_reported():
    anchors = jnp.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]] * 2)
    ranges = jnp.full((6,), 1.5)
    graph = range_graph(anchors, ranges, 0.1)
    init = {"p": jnp.array([[0.5, 0.5], [2.5, 0.5]])}
    sol = rr.solve_graph(graph, init, max_steps=1, throw=False)
    assert sol.result == rr.RESULTS.max_steps_reached
    assert bool(jnp.all(jnp.isnan(sol.x)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number"):
        rr.solve_graph(graph, init, max_steps=1)
    bp = rr.propagate_beliefs(graph, init, max_steps=1, throw=False)
    assert bp.result == rr.RESULTS.max_steps_reached
    assert bool(jnp.all(jnp.isnan(bp.x)))


@pytest.mark.float32
def test_float32_chain():
    meas = jnp.asarray(np.random.default_rng(0).normal(size=(N, 2)), jnp.float32)
    graph = chain(meas)
    # the posterior in float64, by numpy, from the graph's float32 system
    zero = jnp.zeros(graph.size, jnp.float32)
    precision = np.asarray(graph.dense_jacobian(zero), np.float64)
    mean64 = np.linalg.solve(precision, -np.asarray(graph.gradient(zero), np.float64))
    sol = jax.jit(rr.solve_graph)(graph)
    assert sol.x.dtype == jnp.float32
    np.testing.assert_allclose(sol.x, mean64, atol=1e-5)
    bp = rr.propagate_beliefs(graph, schedule="sequential")
    assert bp.x.dtype == jnp.float32
    np.testing.assert_allclose(bp.x, mean64, atol=1e-5)
    grad = jax.grad(lambda m: jnp.sum(rr.solve_graph(chain(m)).x ** 2))(meas)
    assert grad.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(grad)))


def test_errors(meas):
    graph = chain(meas)
    with pytest.raises(ValueError, match="`tol`"):
        rr.solve_graph(graph, tol=0.0)
    with pytest.raises(ValueError, match="`tol`"):
        rr.propagate_beliefs(graph, tol=-1.0)
    with pytest.raises(ValueError, match="`max_steps`"):
        rr.solve_graph(graph, max_steps=0)
    with pytest.raises((ValueError, TypeError), match="damping"):
        rr.propagate_beliefs(graph, damping=1.0)
    with pytest.raises((ValueError, TypeError), match="schedule"):
        rr.propagate_beliefs(graph, schedule="random")
    with pytest.raises((ValueError, TypeError), match="linear_solver"):
        rr.solve_graph(graph, linear_solver="sparse")
    with pytest.raises(TypeError, match="jacobian_dtype"):
        rr.solve_graph(graph, jacobian_dtype=jnp.int32)
    with pytest.raises(ValueError, match="does not have"):
        rr.FactorGraph({"y": (N, 2)}, graph.factors)
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
        rr.FactorGraph({"x": (3, 2)}, graph.factors)
    with pytest.raises(ValueError, match="columns"):
        rr.FactorGraph({"x": (N, 3)}, graph.factors)
    with pytest.raises(ValueError, match="shape"):
        rr.solve_graph(graph, {"x": jnp.zeros((N, 3))})
    with pytest.raises(ValueError, match="unknown variables"):
        graph.flatten({"z": jnp.zeros(2)})
    with pytest.raises(ValueError, match="positive semidefinite"):
        rr.GaussianFactor.prior("a", [0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="same number of rows"):
        rr.GaussianFactor.between(("x", range(3)), ("x", range(4)), 1.0, dim=2)
    with pytest.raises(ValueError, match="slot"):
        rr.GaussianFactor.prior(3, [0.0], 1.0)
    r1, _, _ = example.graph()
    with pytest.raises(ValueError, match="neither connected nor observed"):
        rr.RelationFactor(r1, {"a": "a"})
    with pytest.raises(ValueError, match="unknown channels"):
        rr.RelationFactor(r1, {"a": "a", "q": "b"})
    with pytest.raises(ValueError, match="size"):
        rr.FactorGraph({"a": 2, "b": 1}, [rr.RelationFactor(r1, {"a": "a", "b": "b"})])
    with pytest.raises(TypeError, match="FactorGraph"):
        rr.solve_graph(r1)


def test_precision_forms():
    eye = jnp.eye(2)
    rows2, rows3 = [("x", [0, 1])], [("x", [0, 1, 2])]
    diag = rr.GaussianFactor(rows2, eye, jnp.zeros(2), [1.0, 2.0]).precision
    np.testing.assert_array_equal(
        diag, jnp.stack([jnp.diag(jnp.array([1.0, 2.0]))] * 2)
    )
    per_row = rr.GaussianFactor(rows3, eye, jnp.zeros(2), [1.0, 2.0, 3.0]).precision
    np.testing.assert_array_equal(per_row[2], 3 * eye)
    matrix = [[1.0, 0.5], [0.5, 2.0]]
    full = rr.GaussianFactor(rows2, eye, jnp.zeros(2), matrix).precision
    np.testing.assert_array_equal(full[1], jnp.asarray(matrix))
    per_row_diag = rr.GaussianFactor(
        rows3, eye, jnp.zeros(2), [[1.0, 2.0]] * 3
    ).precision
    np.testing.assert_array_equal(per_row_diag[0], jnp.diag(jnp.array([1.0, 2.0])))


@pytest.mark.full
def test_deblurred_relation_beliefs_in_a_graph():
    # A relation N(0, s^2 I) over (a, b) built with `deblur=True`, b measured:
    # the graph's Laplace covariances and propagation's are those of the
    # data's own s^2 (exact), not of the smoothed field; the answer is the
    # field's, as without `deblur`.
    s, noise, y = 0.3, 0.2, 0.5
    sched = rd.VPSDE()
    mix = rd.GaussianMixtureEps(sched, jnp.zeros((1, 2)), s)
    nodes = rr.field_nodes(jax.random.key(0), 2)
    lam = rr.density_lambda(sched, nodes)

    def graph(deblur):
        relation = rr.ImplicitDiffusion(mix, nodes, lam=lam, deblur=deblur)
        factor = rr.Factor(relation, {"a": 1, "b": 1})
        return rr.FactorGraph(
            {"a": 1, "b": 1},
            [
                rr.RelationFactor(factor, {"a": "a", "b": "b"}),
                rr.GaussianFactor(["b"], [[1.0]], [y], 1 / noise**2),
            ],
        )

    sharp, blurred = graph(True), graph(False)
    sol = rr.solve_graph(sharp)
    np.testing.assert_allclose(sol.x, rr.solve_graph(blurred).x, rtol=1e-12)
    laplace = rr.graph_laplace(sharp, sol)
    want = {"a": s**2, "b": 1 / (1 / s**2 + 1 / noise**2)}
    for k in "ab":
        np.testing.assert_allclose(laplace[k][0, 0], want[k], rtol=1e-9)
    wide = rr.graph_laplace(blurred, sol)
    assert float(wide["a"][0, 0]) > 1.01 * s**2
    bp = rr.propagate_beliefs(sharp)
    for k in "ab":
        np.testing.assert_allclose(bp.covariances[k][0, 0], want[k], rtol=1e-9)


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_graph_factor_precisions_are_checked_row_by_row_under_jit(dtype):
    # Before: a graph built inside the user's `jit` took any traced precision
    # (negative, non-symmetric, NaN); only concrete ones were refused.
    good = jnp.asarray(
        [[[1.0, 0.0], [0.0, 1.0]], [[2.0, 0.5], [0.5, 1.0]], [[1.0, 1.0], [1.0, 1.0]]],
        dtype,
    )  # the last is singular PSD: its smallest eigenvalue is rounding

    def build(p):
        eye, zeros = jnp.eye(2, dtype=dtype), jnp.zeros(2, dtype)
        return rr.GaussianFactor([("x", [0, 1, 2])], eye, zeros, p).precision

    bad = [
        (good.at[1].set(jnp.diag(jnp.asarray([1.0, -2.0], dtype))), "negative"),
        (good.at[2, 0, 1].set(0.0), "not symmetric"),
        (good.at[0, 1, 1].set(jnp.nan), "finite"),
    ]
    eager = {
        "negative": "`precision` must be symmetric positive semidefinite: its "
        "smallest eigenvalue is -2",
        "not symmetric": "`precision` must be symmetric positive semidefinite: "
        "it differs from its transpose by 1",
        "finite": "`precision` must be finite",
    }
    traced = {
        "negative": "`precision` must be symmetric positive semidefinite "
        "\\(it has a negative eigenvalue\\)",
        "not symmetric": "`precision` must be symmetric positive semidefinite "
        "\\(it is not symmetric\\)",
        "finite": "`precision` must be finite",
    }
    jitted, users = jax.jit(build), retrax.filter_jit(build)
    np.testing.assert_array_equal(build(good), good)
    np.testing.assert_array_equal(jitted(good), good)
    np.testing.assert_array_equal(users(good), good)
    for p, what in bad:
        with pytest.raises(ValueError, match=eager[what]):
            build(p)
        with pytest.raises(Exception, match=traced[what]):
            jax.block_until_ready(jitted(p))
        with pytest.raises(eqx.EquinoxRuntimeError, match="^" + traced[what]):
            users(p)
    # one bad row among many identical good ones is found
    many = jnp.broadcast_to(good[1], (64, 2, 2)).at[37, 0, 0].set(-1.0)
    many = many.at[37, 1, 1].set(-1.0)

    def prior(p):
        return rr.GaussianFactor.prior(("x", range(64)), jnp.zeros((64, 2), dtype), p)

    with pytest.raises(Exception, match=traced["negative"]):
        jax.block_until_ready(jax.jit(lambda p: prior(p).precision)(many))
