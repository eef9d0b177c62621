"""Queries in batches fail one by one, and full precisions as evidence."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
import retrax.relations as rr
from helpers import QuadraticEnergy, raises_eagerly_and_under_jit


SCHED = rd.VPSDE()


def ring_factor():
    """A ring of 48 Gaussian lumps (a closed-form predictor) over x and y."""
    ang = 2 * np.pi * np.arange(48) / 48
    means = jnp.asarray(np.stack([np.cos(ang), np.sin(ang)], 1))
    mix = rd.GaussianMixtureEps(SCHED, means, jnp.asarray(0.05))
    nodes = rr.field_nodes(jax.random.key(0), 2, samples=8)
    return rr.Factor(rr.ImplicitDiffusion(mix, nodes), {"x": 1, "y": 1})


def batch(factor, xs, starts, precisions, throw=False):
    def one(x, start, p):
        marks = {"x": rr.Observed(x), "y": rr.Latent(start)}
        return rr.factor_infer(factor, marks, throw=throw)

    def soft(x, start, p):
        marks = {"x": rr.Unobserved(x, p), "y": rr.Latent(start)}
        return rr.factor_infer(factor, marks, throw=throw)

    return jax.vmap(one)(xs, starts, precisions), jax.vmap(soft)(xs, starts, precisions)


@pytest.mark.full
def test_one_bad_query_fails_alone():
    # A bad clamp, a bad start and a bad precision in turn, each against the
    # same good batch of 64 (one set of compiled solves serves the three): the
    # 63 other answers are the good batch's.
    factor = ring_factor()
    n, bad = 64, 5
    xs = jnp.linspace(-0.8, 0.8, n)
    starts = jnp.full((n,), 0.5)
    precisions = jnp.full((n,), 4.0)
    good_hard, good_soft = batch(factor, xs, starts, precisions)
    assert bool(jnp.all(good_hard.result == rr.RESULTS.successful))
    assert bool(jnp.all(good_soft.result == rr.RESULTS.successful))
    keep = np.arange(n) != bad
    for what in ("clamp", "start", "precision"):
        if what == "clamp":
            args = (xs.at[bad].set(jnp.nan), starts, precisions)
        elif what == "start":
            args = (xs, starts.at[bad].set(jnp.nan), precisions)
        else:
            args = (xs, starts, precisions.at[bad].set(-1.0))
        hard, soft = batch(factor, *args)
        # a bad precision is a bad query only where the precision is read
        failing = [soft] if what == "precision" else [hard, soft]
        for sol, good in [(hard, good_hard), (soft, good_soft)]:
            ok = keep if sol in failing else np.ones(n, bool)
            if sol in failing:
                assert bool((sol.result == rr.RESULTS.invalid_query)[bad]), what
                assert bool(jnp.all(jnp.isnan(sol.value[bad]))), what
                assert not bool(sol.converged[bad]), what
                assert bool(jnp.isnan(sol.clamp_load[bad])), what
            assert bool(jnp.all((sol.result == rr.RESULTS.successful)[ok])), what
            np.testing.assert_allclose(
                sol.value[ok], good.value[ok], rtol=0, atol=1e-12, err_msg=what
            )
            np.testing.assert_array_equal(
                sol.stats["num_steps"][ok], good.stats["num_steps"][ok], err_msg=what
            )


@pytest.mark.slow
def test_bad_query_raises_with_throw():
    factor = ring_factor()
    xs = jnp.linspace(-0.8, 0.8, 8).at[3].set(jnp.nan)
    starts = jnp.full((8,), 0.5)
    with pytest.raises(eqx.EquinoxRuntimeError, match="observed value of channel 'x'"):
        batch(factor, xs, starts, starts, throw=True)
    with pytest.raises(eqx.EquinoxRuntimeError, match="`z0` must be finite"):
        z0 = jnp.stack([xs, starts], 1)
        rho = jnp.broadcast_to(jnp.array([jnp.inf, 0.0]), (8, 2))
        jax.vmap(lambda a, b: rr.implicit_infer(factor, a, b))(z0, rho)


@pytest.mark.slow
def test_bad_query_gradients_are_nan_alone():
    factor = ring_factor()
    xs = jnp.linspace(-0.8, 0.8, 4)

    def answers(xs):
        def one(x):
            marks = {"x": rr.Observed(x), "y": rr.Latent(0.5)}
            return rr.factor_infer(factor, marks, throw=False).value[1]

        return jax.vmap(one)(xs)

    jac = jax.jacrev(answers)(xs.at[2].set(jnp.nan))
    good = jax.jacrev(answers)(xs)
    # the bad answer's derivative by its own input is NaN and by the others' 0;
    # the others' derivatives by their own inputs are untouched (by the bad
    # input they are NaN: a zero cotangent times the bad query's NaN gate)
    assert bool(jnp.isnan(jac[2, 2]))
    keep = np.array([0, 1, 3])
    np.testing.assert_array_equal(jac[2, keep], 0)
    np.testing.assert_allclose(jac[keep][:, keep], good[keep][:, keep], atol=1e-12)


def gaussian_factor():
    """A correlated Gaussian N(mean, prec^-1) over channels x (1), y (2), w (1)."""
    t = 0.01
    rng = np.random.default_rng(0)
    m = rng.normal(size=(4, 4))
    a = jnp.asarray(m @ m.T / 4 + np.eye(4))
    b = jnp.asarray(rng.normal(size=4))
    nodes = rr.noisefree_nodes(4, t)
    pred = rd.EnergyNetwork(QuadraticEnergy(a, b), SCHED)
    rel = rr.ImplicitDiffusion(pred, nodes, lam=rr.density_lambda(SCHED, nodes))
    alpha = SCHED.alpha(jnp.asarray(t))
    return rr.Factor(rel, {"x": 1, "y": 2, "w": 1}), alpha**2 * a, b / alpha


def gaussian_posterior(prec, mean, free, evidence_prec, evidence_mean, x):
    """The exact posterior over the free coordinates of N(mean, prec^-1) with
    coordinate 0 clamped to `x`, times N(evidence_mean, evidence_prec^-1)
    on the free coordinates."""
    free = np.asarray(free)
    pff = prec[np.ix_(free, free)]
    # the conditional's information, plus the evidence's
    info = pff @ mean[free] - prec[np.ix_(free, [0])] @ (x - mean[:1])
    post = pff + evidence_prec
    return jnp.linalg.solve(post, info + evidence_prec @ evidence_mean), post


P_FULL = jnp.array([[5.0, -2.0], [-2.0, 3.0]])


@pytest.mark.full
def test_full_precision_is_the_exact_gaussian_posterior():
    factor, prec, mean = gaussian_factor()
    v = jnp.array([0.4, -0.7])
    marks = {"x": rr.Observed(0.3), "y": rr.Unobserved(v, P_FULL)}
    sol = rr.factor_infer(factor, marks)
    assert sol.result == rr.RESULTS.successful
    ev = jnp.zeros((3, 3)).at[:2, :2].set(P_FULL)
    ev_mean = jnp.concatenate([v, jnp.zeros(1)])
    exact, post = gaussian_posterior(prec, mean, [1, 2, 3], ev, ev_mean, 0.3)
    np.testing.assert_allclose(sol.value[1:], exact, rtol=0, atol=1e-8)
    # the Laplace belief has the exact posterior covariance
    _, rho, coupling = factor.query_coupled(marks)
    belief = rr.laplace_belief(factor, sol, rho, coupling=coupling)
    np.testing.assert_allclose(
        belief.cov[1:, 1:], jnp.linalg.inv(post), rtol=1e-8, atol=1e-10
    )

    # gradients by the implicit function theorem match finite differences
    def answer(p01):
        p = P_FULL.at[0, 1].set(p01).at[1, 0].set(p01)
        m = {"x": rr.Observed(0.3), "y": rr.Unobserved(v, p)}
        return rr.factor_infer(factor, m).value[3]

    h = 1e-5
    fd = (answer(-2.0 + h) - answer(-2.0 - h)) / (2 * h)
    np.testing.assert_allclose(jax.grad(answer)(-2.0), fd, rtol=1e-6)
    # the query vectors alone cannot hold a precision matrix
    with pytest.raises(ValueError, match="query_coupled"):
        factor.query(marks)
    with pytest.raises(ValueError, match="precision matrix"):
        rr.factor_pullback(factor, sol, marks, jnp.ones(4))


def test_diagonal_precision_matrix_equals_the_vector():
    factor, _, _ = gaussian_factor()
    v = jnp.array([0.4, -0.7])
    p = jnp.array([5.0, 3.0])
    vector = {"x": rr.Observed(0.3), "y": rr.Unobserved(v, p)}
    matrix = {"x": rr.Observed(0.3), "y": rr.Unobserved(v, jnp.diag(p))}
    a = rr.factor_infer(factor, vector)
    b = rr.factor_infer(factor, matrix)
    np.testing.assert_allclose(a.value, b.value, rtol=0, atol=1e-12)
    z0, rho = factor.query(vector)
    z0m, rhom, coupling = factor.query_coupled(matrix)
    np.testing.assert_array_equal(z0, z0m)
    np.testing.assert_array_equal(rho, rhom)
    np.testing.assert_array_equal(coupling, 0)
    assert factor.query_coupled(vector)[2] is None


@pytest.mark.slow
def test_message_precision_fed_back_as_evidence():
    factor, prec, mean = gaussian_factor()
    # the factor's message to y given x and a weak anchor on w
    marks = {"x": rr.Observed(0.3), "w": rr.Unobserved(0.0, 1e-3)}
    msg = rr.factor_messages(factor, rr.factor_infer(factor, marks), marks)["y"]
    msg_mean = jnp.linalg.solve(msg.precision, msg.info)
    assert float(jnp.abs(msg.precision[0, 1])) > 0.1
    # fed back into a second query as evidence on y
    back = {"x": rr.Observed(-0.2), "y": rr.Unobserved(msg_mean, msg.precision)}
    sol = rr.factor_infer(factor, back)
    ev = jnp.zeros((3, 3)).at[:2, :2].set(msg.precision)
    ev_mean = jnp.concatenate([msg_mean, jnp.zeros(1)])
    exact, post = gaussian_posterior(prec, mean, [1, 2, 3], ev, ev_mean, -0.2)
    np.testing.assert_allclose(sol.value[1:], exact, rtol=0, atol=1e-8)
    # and the message from the second query divides that evidence out again
    again = rr.factor_messages(factor, sol, back)["y"]
    anchor = rr.channel_anchor(factor, back, "y")
    np.testing.assert_allclose(anchor.precision, msg.precision, rtol=1e-12)
    cov = jnp.linalg.inv(post)[:2, :2]
    np.testing.assert_allclose(
        again.precision + anchor.precision, jnp.linalg.inv(cov), rtol=1e-8
    )


@pytest.mark.parametrize(
    "p", [jnp.array([[5.0, -2.0], [-1.0, 3.0]]), jnp.array([[1.0, 2.0], [2.0, 1.0]])]
)
def test_bad_precision_matrix_is_refused(p):
    factor, _, _ = gaussian_factor()

    def query(p):
        return factor.query_coupled({"y": rr.Unobserved(0.0, p)})[2]

    with pytest.raises(ValueError, match="`precision` of the unobserved channel 'y'"):
        query(p)
    raises_eagerly_and_under_jit(
        query, p, match="`precision` of the unobserved channel 'y' must be"
    )
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        query(jnp.eye(3))
    # with throw=False, the query's own failure
    sol = rr.factor_infer(factor, {"y": rr.Unobserved(0.0, p)}, throw=False)
    assert sol.result == rr.RESULTS.invalid_query
    assert bool(jnp.all(jnp.isnan(sol.value)))


@pytest.mark.slow
def test_chunked_batch_is_the_queries_one_by_one():
    # 21 queries in chunks of 8 (two full chunks and a remainder), in one loop
    # (a chunk larger than the batch) and one by one: the same answers, steps,
    # result codes and gradients, in value and through the implicit adjoint.
    factor = ring_factor()
    rho = jnp.array([jnp.inf, 0.0])
    xs = jnp.linspace(-0.9, 0.9, 21)
    z0 = jnp.stack([xs, jnp.where(jnp.arange(21) % 2 == 0, 0.5, -0.5)], 1)

    def solve(chunk):
        def loss(q):
            sol = rr.implicit_infer(factor, q, rho, throw=False, batch_chunk=chunk)
            return jnp.sum(sol.value**2), sol

        return eqx.filter_jit(jax.vmap(jax.grad(loss, has_aux=True)))(z0)

    grad_one = jax.grad(lambda q: jnp.sum(rr.implicit_infer(factor, q, rho).value ** 2))
    one_by_one = [
        (grad_one(q), rr.implicit_infer(factor, q, rho, throw=False)) for q in z0
    ]
    grads = jnp.stack([g for g, _ in one_by_one])
    for chunk in (8, 64):
        grad, sol = solve(chunk)
        assert bool(jnp.all(sol.result == rr.RESULTS.successful))
        np.testing.assert_allclose(
            sol.value, jnp.stack([s.value for _, s in one_by_one]), rtol=0, atol=1e-12
        )
        np.testing.assert_array_equal(
            sol.stats["num_steps"], [int(s.stats["num_steps"]) for _, s in one_by_one]
        )
        np.testing.assert_allclose(grad, grads, rtol=0, atol=1e-10)


@pytest.mark.slow
def test_chunked_batch_of_models():
    # A batch over the model as well as the query (an ensemble): each model
    # answers its own query, chunked or not.
    factor = ring_factor()
    rho = jnp.array([jnp.inf, 0.0])
    lams = jnp.linspace(0.5, 2.0, 5)
    models = jax.vmap(lambda lam: eqx.tree_at(lambda f: f.relation.lam, factor, lam))(
        lams
    )
    z0 = jnp.stack([jnp.linspace(-0.5, 0.5, 5), jnp.full((5,), 0.5)], 1)

    def solve(chunk):
        return eqx.filter_jit(
            eqx.filter_vmap(
                lambda m, q: rr.implicit_infer(m, q, rho, batch_chunk=chunk).value
            )
        )(models, z0)

    single = jnp.stack(
        [
            rr.implicit_infer(
                eqx.tree_at(lambda f: f.relation.lam, factor, lam), q, rho
            ).value
            for lam, q in zip(lams, z0, strict=True)
        ]
    )
    for chunk in (2, 16):
        np.testing.assert_allclose(solve(chunk), single, rtol=0, atol=1e-12)


def test_batch_chunk_must_be_positive():
    factor = ring_factor()
    rho = jnp.array([jnp.inf, 0.0])
    for bad in (0, -3, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="batch_chunk"):
            rr.implicit_infer(factor, jnp.array([0.6, 0.5]), rho, batch_chunk=bad)
