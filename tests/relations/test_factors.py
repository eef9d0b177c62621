"""Factors with channels, their pullback, Gaussian beliefs, messages and the
local free energy."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
import retrax.relations as rr
from helpers import (
    FLOAT32_RTOL,
    QuadraticEnergy,
    assert_close,
    gaussian_energy_factor,
    raises_eagerly_and_under_jit,
)


SCHED = rd.VPSDE()
T = 0.01
INF = jnp.inf


def gaussian_factor():
    """A correlated Gaussian over channels x (1), y (2), w (1)."""
    rng = np.random.default_rng(0)
    m = rng.normal(size=(4, 4))
    a = jnp.asarray(m @ m.T / 4 + np.eye(4))
    b = jnp.asarray(rng.normal(size=4))
    nodes = rr.noisefree_nodes(4, T)
    pred = rd.EnergyNetwork(QuadraticEnergy(a, b), SCHED)
    rel = rr.ImplicitDiffusion(pred, nodes, lam=rr.density_lambda(SCHED, nodes))
    alpha = SCHED.alpha(jnp.asarray(T))
    # The field is alpha^2 A (z - b / alpha), lam_eff = 1: the relation's
    # density is N(b / alpha, (alpha^2 A)^-1).
    return rr.Factor(rel, {"x": 1, "y": 2, "w": 1}), alpha**2 * a, b / alpha


def closed_posterior(prec, mean, z0, p_anchor):
    """The Gaussian N(mean, prec^-1) times independent anchors N(z0, 1/p)."""
    post = prec + jnp.diag(p_anchor)
    cov = jnp.linalg.inv(post)
    return cov @ (prec @ mean + p_anchor * z0), cov


@pytest.mark.full
def test_factor_query_and_layout():
    factor, _, _ = gaussian_factor()
    marks = {
        "x": rr.Observed(jnp.asarray(0.3)),
        "y": rr.Unobserved(jnp.array([1.0, -1.0]), jnp.array([4.0, 0.25])),
    }
    z0, rho = factor.query(marks)
    assert_close(z0, jnp.array([0.3, 1.0, -1.0, 0.0]))
    np.testing.assert_array_equal(rho, np.array([np.inf, 2.0, 0.5, 0.0]))
    assert factor.coords("w", "x") == (3, 0)
    assert_close(factor.split(z0)["y"], jnp.array([1.0, -1.0]))
    assert_close(factor.join({"w": 2.0}), jnp.array([0.0, 0.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="unknown channels \\['v'\\]"):
        factor.query({"v": rr.Latent()})
    with pytest.raises(TypeError, match="marks"):
        factor.query({"x": 0.3})
    with pytest.raises(ValueError, match="have 3 coordinates in all"):
        rr.Factor(factor.relation, {"x": 1, "y": 2})

    def bad_precision(p):
        return factor.query({"w": rr.Unobserved(1.0, p)})[1]

    raises_eagerly_and_under_jit(
        bad_precision,
        jnp.asarray(0.0),
        match="the precision of the unobserved channel 'w' must be positive",
    )


@pytest.mark.slow
def test_factor_pullback_is_the_gradient_and_finite_differences():
    """Per channel cotangents, precisions included, on a non-Gaussian relation."""
    means = jnp.array([[-1.0, 0.0, 0.5], [1.0, 0.5, 0.0], [0.0, -1.0, 1.0]])
    mix = rd.GaussianMixtureEps(SCHED, means, 0.6)
    nodes = rr.field_nodes(jax.random.key(3), 3, samples=2)
    rel = rr.ImplicitDiffusion(mix, nodes, lam=rr.density_lambda(SCHED, nodes))
    factor = rr.Factor(rel, {"a": 1, "b": 1, "c": 1})
    zbar = {"b": jnp.asarray(0.7), "c": jnp.asarray(-1.3)}

    def marks_of(x, v, p):
        return {
            "a": rr.Observed(x),
            "b": rr.Unobserved(v, p),
            "c": rr.Latent(jnp.asarray(0.2)),
        }

    @jax.jit
    def loss(f, x, v, p):
        sol = rr.factor_infer(f, marks_of(x, v, p), tol=1e-13)
        z = f.split(sol.value)
        return 0.7 * z["b"][0] - 1.3 * z["c"][0]

    args = (jnp.asarray(0.4), jnp.asarray(0.3), jnp.asarray(2.0))
    marks = marks_of(*args)
    sol = rr.factor_infer(factor, marks, tol=1e-13)
    pullback = rr.factor_pullback(factor, sol, marks, zbar)
    assert isinstance(pullback, rr.FactorPullback)
    assert pullback.result == rr.RESULTS.successful
    factor_bar, marks_bar = pullback  # unpacks as the pair it was
    assert pullback.value[1] is marks_bar
    g_factor, *grads = eqx.filter_grad(lambda a: loss(*a))((factor, *args))
    assert_close(marks_bar["a"].value, grads[0], rtol=1e-10)
    assert_close(marks_bar["b"].value, grads[1], rtol=1e-10)
    assert_close(marks_bar["b"].precision, grads[2], rtol=1e-10)
    assert_close(marks_bar["c"].start, jnp.zeros(()), atol=1e-14)
    # the relation's part, against jax.grad: the means, and the field weight,
    # which does not move the answer (precisions are in data units: the
    # stiffnesses scale with it)
    assert_close(
        factor_bar.relation.pred.means, g_factor.relation.pred.means, rtol=1e-9
    )
    assert abs(float(factor_bar.relation.lam)) < 1e-14
    assert abs(float(g_factor.relation.lam)) < 1e-14
    # the precision's cotangent against central finite differences
    h = 1e-5
    x, v, p = args
    fd = (loss(factor, x, v, p + h) - loss(factor, x, v, p - h)) / (2 * h)
    assert_close(marks_bar["b"].precision, fd, rtol=1e-6)
    assert abs(float(fd)) > 1e-3


def test_gaussian_forms_and_marginals():
    rng = np.random.default_rng(1)
    m = rng.normal(size=(4, 4))
    cov = jnp.asarray(m @ m.T + 0.5 * np.eye(4))
    mean = jnp.asarray(rng.normal(size=4))
    g = rr.MomentGaussian(mean, cov)
    c = g.canonical()
    assert_close(c.moment().mean, mean, rtol=1e-12)
    assert_close(c.moment().cov, cov, rtol=1e-12)
    # the Schur complement of the canonical form is the moment marginal
    assert_close(c.marginal([2, 0]).moment().mean, mean[jnp.array([2, 0])], 1e-12)
    assert_close(c.marginal([2, 0]).moment().cov, cov[np.ix_([2, 0], [2, 0])], 1e-12)
    # product and quotient
    other = rr.MomentGaussian(-mean, 2 * cov)
    prod = rr.combine(g, other)
    assert_close(prod.precision, c.precision + other.canonical().precision)
    back = rr.divide(prod, other)
    assert_close(back.info, c.info, rtol=1e-12)
    assert_close(back.precision, c.precision, rtol=1e-12)
    with pytest.raises(ValueError, match="different dimensions"):
        rr.combine(g, g.marginal([0]))
    with pytest.raises(ValueError, match="repeats a coordinate"):
        g.marginal([1, 1])


@pytest.mark.full
def test_marginal_beliefs_are_the_joint_gaussians_marginals():
    factor, prec, mean = gaussian_factor()
    marks = {
        "x": rr.Unobserved(jnp.asarray(0.5), jnp.asarray(3.0)),
        "w": rr.Unobserved(jnp.asarray(-0.2), jnp.asarray(0.5)),
    }
    z0, rho = factor.query(marks)
    sol = rr.factor_infer(factor, marks)
    p_anchor = jnp.array([3.0, 0.0, 0.0, 0.5])
    post_mean, post_cov = closed_posterior(prec, mean, z0, p_anchor)
    coords = factor.coords("y", "x")
    # (under `jit`: the Laplace covariance one program, not op by op)
    belief = eqx.filter_jit(rr.laplace_belief)(factor, sol, rho, coords)
    idx = np.asarray(coords)
    assert_close(belief.mean, post_mean[idx], rtol=1e-12)
    assert_close(belief.cov, post_cov[np.ix_(idx, idx)], rtol=1e-12)
    assert_close(belief.canonical().moment().cov, belief.cov, rtol=1e-11)


@pytest.mark.slow
def test_mixture_finds_its_roots_and_marginalises():
    factor, prec, mean = gaussian_factor()
    marks = {"x": rr.Unobserved(jnp.asarray(0.5), jnp.asarray(3.0))}
    z0, rho = factor.query(marks)
    post_mean, post_cov = closed_posterior(
        prec, mean, z0, jnp.array([3.0, 0.0, 0.0, 0.0])
    )
    coords = factor.coords("w", "y")
    idx = np.asarray(coords)
    key = jax.random.key(0)
    mixture = rr.implicit_mixture(
        factor, None, z0, rho, coords=coords, key=key, n_starts=3
    )
    # one root (a Gaussian), found from every start
    assert_close(mixture.weights, jnp.array([1.0, 0.0, 0.0]), atol=1e-15)
    assert_close(mixture.means[0], post_mean[idx], rtol=1e-12)
    assert_close(mixture.covs[0], post_cov[np.ix_(idx, idx)], rtol=1e-12)
    roots = rr.implicit_roots(factor, z0, rho, key=key, n_starts=3)
    given = rr.implicit_mixture(factor, roots, z0, rho).marginal(coords)
    # (invalid slots' covariances are NaN, as in implicit_laplace)
    assert_close(given.weights, mixture.weights, rtol=1e-14)
    assert_close(given.means[0], mixture.means[0], rtol=1e-14)
    assert_close(given.covs[0], mixture.covs[0], rtol=1e-14)
    with pytest.raises(ValueError, match="are for finding roots"):
        rr.implicit_mixture(factor, roots, z0, rho, key=key)


def test_message_times_anchor_is_the_posterior():
    factor, prec, mean = gaussian_factor()
    marks = {
        "x": rr.Observed(jnp.asarray(0.5)),
        "y": rr.Unobserved(jnp.array([0.1, 0.4]), jnp.array([2.0, 0.7])),
        "w": rr.Unobserved(jnp.asarray(-0.2), jnp.asarray(0.5)),
    }
    z0, _ = factor.query(marks)
    sol = rr.factor_infer(factor, marks)
    messages = rr.factor_messages(factor, sol, marks)
    assert set(messages) == {"y", "w"}
    # the posterior over the free coordinates (x is clamped: condition on it)
    free = np.array([1, 2, 3])
    cond_prec = prec[np.ix_(free, free)]
    cond_mean = mean[free] - jnp.linalg.solve(
        cond_prec, prec[free, 0] * (0.5 - mean[0])
    )
    p_anchor = jnp.array([2.0, 0.7, 0.5])
    post_mean, post_cov = closed_posterior(cond_prec, cond_mean, z0[free], p_anchor)
    for name, sub in (("y", [0, 1]), ("w", [2])):
        anchor = rr.channel_anchor(factor, marks, name)
        posterior = rr.combine(messages[name], anchor).moment()
        s = np.asarray(sub)
        assert_close(posterior.mean, post_mean[s], rtol=1e-12)
        assert_close(posterior.cov, post_cov[np.ix_(s, s)], rtol=1e-12)
        # and the message is the relation's marginal likelihood of the channel
        # given the other channels' anchors (belief propagation's message)
        with_others = closed_posterior(
            cond_prec, cond_mean, z0[free], p_anchor.at[s].set(0.0)
        )
        expected = rr.MomentGaussian(*with_others).marginal(sub).canonical()
        assert_close(messages[name].precision, expected.precision, rtol=1e-11)
        assert_close(messages[name].info, expected.info, rtol=1e-11)
    points = rr.factor_messages(factor, sol, marks, kind="point")
    assert_close(points["x"], jnp.array([0.5]))


def test_local_free_energy_is_the_gaussian_evidence():
    factor, prec, mean = gaussian_factor()

    def evidence(v, p):
        """-log of the integral of N(mean, prec^-1)-shaped exp(-U) times anchors."""
        post = prec + jnp.diag(p)
        h = prec @ mean + p * v
        quad = mean @ prec @ mean + jnp.sum(p * v**2) - h @ jnp.linalg.solve(post, h)
        return 0.5 * jnp.linalg.slogdet(post / (2 * jnp.pi))[1] + 0.5 * quad

    # The relation's potential E(alpha z) is the Gaussian's exponent with no
    # constant, so the free energy is the evidence itself.
    for value, p in ((0.3, 2.0), (-1.0, 0.25)):
        marks = {"w": rr.Unobserved(jnp.asarray(value), jnp.asarray(p))}
        z0, rho = factor.query(marks)
        sol = rr.factor_infer(factor, marks)
        f = rr.local_free_energy(factor, sol, z0, rho)
        assert_close(f, evidence(z0, jnp.array([0.0, 0.0, 0.0, p])), rtol=1e-12)
        assert abs(float(f)) > 0.1


RTOL = FLOAT32_RTOL


@pytest.mark.float32
def test_factor_message_and_precision_gradient():
    # Two channels of a three-component mixture: a observed, b soft.
    means = np.asarray([[0.6, 0.8], [0.6, -0.8], [-1.0, 0.0]])

    def query(means, precision):
        dtype = means.dtype
        sched = rd.VPSDE()
        mix = rd.GaussianMixtureEps(sched, means, jnp.asarray(0.3, dtype))
        # noise-free nodes: the same relation in both precisions (random
        # nodes drawn in float32 and float64 differ)
        nodes = rr.noisefree_nodes(2, 0.02, dtype=dtype)
        model = rr.ImplicitDiffusion(mix, nodes, lam=rr.density_lambda(sched, nodes))
        factor = rr.Factor(model, {"a": 1, "b": 1})
        marks = {
            "a": rr.Observed(jnp.asarray(0.6, dtype)),
            "b": rr.Unobserved(jnp.asarray(0.5, dtype), precision),
        }
        sol = rr.factor_infer(factor, marks)
        message = rr.factor_messages(factor, sol, marks)["b"]
        return sol.value[1], message.precision[0, 0], sol.converged & sol.stable

    def answer(means, precision):
        return query(means, precision)[0]

    run = jax.jit(query)
    grad = jax.jit(jax.grad(answer, argnums=(0, 1)))
    args32 = (jnp.asarray(means, jnp.float32), jnp.asarray(2.0, jnp.float32))
    *v32, ok32 = run(*args32)
    g32 = grad(*args32)
    with jax.enable_x64(True):
        args64 = (jnp.asarray(means), jnp.asarray(2.0))
        *v64, ok64 = run(*args64)
        g64 = [np.asarray(g) for g in grad(*args64)]
        v64 = [np.asarray(v) for v in v64]
    assert bool(ok32) and bool(ok64)
    for v, r in zip(v32, v64, strict=True):
        assert v.dtype == jnp.float32
        assert_close(v, r, rtol=RTOL)
    for g, r in zip(g32, g64, strict=True):
        assert g.dtype == jnp.float32
        assert np.max(np.abs(r)) > 0
        assert_close(g, r, rtol=RTOL)


def _rank2_cov(dtype):
    a = np.random.default_rng(0).normal(size=(3, 2))
    return jnp.asarray(a @ a.T, dtype)


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.full
def test_singular_gaussians_convert_to_nan(dtype):
    # Before: entries of 1e7 (float32) to 1e16 (float64), rounding error
    # inverted, where the docstrings promise NaN.
    mean = jnp.asarray([1.0, 2.0, 3.0], dtype)
    cov = _rank2_cov(dtype)
    clamped = jnp.diag(jnp.asarray([1.0, 0.0, 2.0], dtype))
    flat = jnp.zeros((3, 3), dtype)
    cases = [
        lambda m, c: rr.MomentGaussian(m, c).canonical(),
        lambda m, c: rr.CanonicalGaussian(m, c).moment(),
    ]
    for convert in cases:
        for singular in (cov, clamped, flat):
            for out in (convert(mean, singular), jax.jit(convert)(mean, singular)):
                leaves = jax.tree.leaves(out)
                assert all(leaf.dtype == dtype for leaf in leaves)
                assert all(np.all(np.isnan(leaf)) for leaf in leaves), out
    # an indefinite precision (a quotient's) has no moment form either
    quotient = rr.divide(
        rr.MomentGaussian(mean, jnp.eye(3, dtype=dtype)),
        rr.MomentGaussian(mean, jnp.diag(jnp.asarray([0.5, 2.0, 2.0], dtype))),
    )
    assert np.all(np.isnan(quotient.moment().cov))
    # the Schur complement over a singular block is NaN too
    p = jnp.asarray([[2.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]], dtype)
    p = p.at[1:, 1:].set(jnp.ones((2, 2), dtype))  # singular block over (1, 2)
    marg = rr.CanonicalGaussian(mean, p).marginal([0])
    assert np.all(np.isnan(marg.precision)) and np.all(np.isnan(marg.info))
    # well-conditioned forms still convert, and an isotropic covariance's
    # derivative is finite (the rank test is not differentiated)
    spd = cov + 0.5 * jnp.eye(3, dtype=dtype)
    back = rr.MomentGaussian(mean, spd).canonical().moment()
    tol = 1e-4 if dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(back.cov, spd, rtol=tol, atol=tol)
    np.testing.assert_allclose(back.mean, mean, rtol=tol, atol=tol)
    grad = jax.grad(lambda c: rr.MomentGaussian(mean, c).canonical().info.sum())(
        jnp.eye(3, dtype=dtype)
    )
    # d/dC of 1^T C^{-1} mu at C = I is -(1 mu^T)'s symmetric part
    expected = -0.5 * (np.outer(np.ones(3), mean) + np.outer(mean, np.ones(3)))
    np.testing.assert_allclose(grad, expected, rtol=tol)


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_gaussian_constructors_refuse_invalid_matrices(dtype):
    mean = jnp.asarray([1.0, 2.0, 3.0], dtype)
    negative = jnp.diag(jnp.asarray([1.0, -2.0, 1.0], dtype))
    skew = jnp.asarray([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype)
    psd = "`cov` must be symmetric positive semidefinite"
    with pytest.raises(ValueError, match=psd + ": its smallest eigenvalue is -2"):
        rr.MomentGaussian(mean, negative)
    with pytest.raises(ValueError, match=psd + ": it differs from its transpose"):
        rr.MomentGaussian(mean, skew)
    with pytest.raises(ValueError, match="`precision` must be symmetric: it differs"):
        rr.CanonicalGaussian(mean, skew)
    with pytest.raises(TypeError, match="`cov` must have a real floating dtype"):
        rr.MomentGaussian(mean, jnp.eye(3, dtype=jnp.int32))

    # under jit, at run time, with the same message
    def moment(m, c):
        return rr.MomentGaussian(m, c).cov

    def canonical(m, c):
        return rr.CanonicalGaussian(m, c).precision

    jit_moment, jit_canonical = jax.jit(moment), jax.jit(canonical)
    with pytest.raises(Exception, match=psd + " \\(it has a negative eigenvalue\\)"):
        jit_moment(mean, negative)
    with pytest.raises(Exception, match=psd + " \\(it is not symmetric\\)"):
        jit_moment(mean, skew)
    with pytest.raises(Exception, match="`precision` must be symmetric \\(it is not"):
        jit_canonical(mean, skew)
    # the product of a refused covariance is never formed: before, combine
    # gave the variance -2 of a "belief" with covariance diag(1, -0.5, 1)
    with pytest.raises(ValueError, match=psd):
        rr.combine(
            rr.MomentGaussian(mean, jnp.diag(jnp.asarray([1.0, -0.5, 1], dtype)))
        )
    # valid matrices pass, eagerly and under jit: PSD with rounding (the
    # rank-2 covariance's smallest eigenvalue is -4e-9 in float32), an
    # indefinite (quotient) precision, and NaN (a failed solve's mark)
    for ok in (_rank2_cov(dtype), jnp.eye(3, dtype=dtype)):
        np.testing.assert_array_equal(moment(mean, ok), ok)
        np.testing.assert_array_equal(jit_moment(mean, ok), ok)
    np.testing.assert_array_equal(jit_canonical(mean, negative), negative)
    nan = jnp.full((3, 3), jnp.nan, dtype)
    assert np.all(np.isnan(moment(mean, nan))) and np.all(
        np.isnan(jit_moment(mean, nan))
    )


@pytest.mark.loud
@pytest.mark.full
def test_factor_infer_refuses_tolerances_and_step_counts_it_cannot_use():
    # Before: tol=-1 failed every query and blamed max_steps.
    factor = gaussian_energy_factor(SCHED)
    marks = {"x": rr.Observed(jnp.asarray(0.5))}
    for tol in (-1.0, 0.0, -1e-9, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="`tol` must be a positive, finite"):
            rr.factor_infer(factor, marks, tol=tol)
    for steps in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="`max_steps` must be a positive integer"):
            rr.factor_infer(factor, marks, max_steps=steps)

    # under jit (the options are fixed when the program is traced)
    @eqx.filter_jit
    def solve(factor, marks, tol):
        return rr.factor_infer(factor, marks, tol=tol).value

    with pytest.raises(ValueError, match="`tol` must be a positive, finite"):
        solve(factor, marks, -1.0)
    with pytest.raises(TypeError, match="`tol` is fixed when the program is traced"):
        jax.jit(lambda tol: rr.factor_infer(factor, marks, tol=tol).value)(1e-9)
    # valid options still answer
    sol = rr.factor_infer(factor, marks, tol=1e-10, max_steps=50)
    assert bool(sol.converged) and bool(sol.stable)
    np.testing.assert_allclose(solve(factor, marks, 1e-10), sol.value, rtol=1e-12)


@pytest.mark.loud
def test_factor_query_refuses_integer_dtypes():
    # Before: an internal error deep in the channel marks (or from inf cast
    # to an integer stiffness).
    factor = gaussian_energy_factor(SCHED)
    marks = {"x": rr.Observed(jnp.asarray(0.5)), "y": rr.Unobserved(0.1, 2.0)}
    for dtype in (jnp.int32, np.int64, bool, "int8"):
        with pytest.raises(TypeError, match="`dtype` must be a real floating dtype"):
            factor.query(marks, dtype=dtype)
        with pytest.raises(TypeError, match="`dtype` must be a real floating dtype"):
            rr.factor_infer(factor, marks, dtype=dtype)
    with pytest.raises(TypeError, match="`dtype` must be a real floating dtype"):
        eqx.filter_jit(lambda f: f.query(marks, dtype=jnp.int32))(factor)
    for dtype in (jnp.float32, jnp.float64):
        z0, rho = factor.query(marks, dtype=dtype)
        assert z0.dtype == dtype and rho.dtype == dtype
        np.testing.assert_array_equal(rho[0], np.inf)


@pytest.mark.loud
def test_marginal_coords_must_be_concrete():
    # Before: jax's TracerArrayConversionError, which does not say that the
    # coordinates fix the marginal's shape.
    mean = jnp.asarray([1.0, 2.0, 3.0])
    cov = jnp.diag(jnp.asarray([1.0, 2.0, 3.0]))
    beliefs = [
        rr.MomentGaussian(mean, cov),
        rr.MomentGaussian(mean, cov).canonical(),
        rr.LaplaceBelief(mean=mean, cov=cov, free=jnp.ones(3, bool)),
    ]
    match = "`coords` must be concrete: they fix the marginal's shape"
    for belief in beliefs:
        with pytest.raises(TypeError, match=match):
            jax.jit(lambda c, b=belief: b.marginal(c).mean)(jnp.asarray([0, 2]))
        # static coordinates work under jit, and agree with eager ones
        eager = belief.marginal([2, 0]).moment()
        jitted = jax.jit(lambda b: b.marginal((2, 0)).moment())(belief)
        np.testing.assert_allclose(jitted.mean, eager.mean, rtol=1e-12)
        np.testing.assert_allclose(jitted.cov, eager.cov, rtol=1e-12)
        np.testing.assert_allclose(eager.mean, [3.0, 1.0], rtol=1e-12)
        np.testing.assert_allclose(eager.cov, np.diag([3.0, 1.0]), rtol=1e-12)
    # and where a belief is made with coords (laplace_belief)
    factor = gaussian_energy_factor(SCHED)
    marks = {"x": rr.Observed(jnp.asarray(0.5))}
    z0, rho = factor.query(marks)
    sol = rr.factor_infer(factor, marks)
    with pytest.raises(TypeError, match=match):
        jax.jit(lambda c: rr.laplace_belief(factor, sol, rho, c).mean)(
            jnp.asarray([1, 2])
        )
    belief = rr.laplace_belief(factor, sol, rho, factor.coords("y"))
    assert belief.mean.shape == (2,) and np.all(np.isfinite(belief.cov))
