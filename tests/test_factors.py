"""Factors with channels, their pullback, Gaussian beliefs, messages and the
local free energy."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
from helpers import assert_close, raises_eagerly_and_under_jit


SCHED = rd.VPSDE()
T = 0.01
INF = jnp.inf


class Quadratic(eqx.Module):
    """The energy 0.5 (x - b)^T A (x - b): a Gaussian relation."""

    a: jax.Array
    b: jax.Array

    def __call__(self, x, t):
        d = x - self.b
        return 0.5 * d @ self.a @ d


def gaussian_factor():
    """A correlated Gaussian over channels x (1), y (2), w (1)."""
    rng = np.random.default_rng(0)
    m = rng.normal(size=(4, 4))
    a = jnp.asarray(m @ m.T / 4 + np.eye(4))
    b = jnp.asarray(rng.normal(size=4))
    nodes = rd.noisefree_nodes(4, T)
    pred = rd.EnergyNetwork(Quadratic(a, b), SCHED)
    rel = rd.ImplicitDiffusion(pred, nodes, lam=rd.density_lambda(SCHED, nodes))
    alpha = SCHED.alpha(jnp.asarray(T))
    # The field is alpha^2 A (z - b / alpha), lam_eff = 1: the relation's
    # density is N(b / alpha, (alpha^2 A)^-1).
    return rd.Factor(rel, {"x": 1, "y": 2, "w": 1}), alpha**2 * a, b / alpha


def closed_posterior(prec, mean, z0, p_anchor):
    """The Gaussian N(mean, prec^-1) times independent anchors N(z0, 1/p)."""
    post = prec + jnp.diag(p_anchor)
    cov = jnp.linalg.inv(post)
    return cov @ (prec @ mean + p_anchor * z0), cov


def test_factor_query_and_layout():
    factor, _, _ = gaussian_factor()
    marks = {
        "x": rd.Observed(jnp.asarray(0.3)),
        "y": rd.Unobserved(jnp.array([1.0, -1.0]), jnp.array([4.0, 0.25])),
    }
    z0, rho = factor.query(marks)
    assert_close(z0, jnp.array([0.3, 1.0, -1.0, 0.0]))
    np.testing.assert_array_equal(rho, np.array([np.inf, 2.0, 0.5, 0.0]))
    assert factor.coords("w", "x") == (3, 0)
    assert_close(factor.split(z0)["y"], jnp.array([1.0, -1.0]))
    assert_close(factor.join({"w": 2.0}), jnp.array([0.0, 0.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match="unknown channels \\['v'\\]"):
        factor.query({"v": rd.Latent()})
    with pytest.raises(TypeError, match="marks"):
        factor.query({"x": 0.3})
    with pytest.raises(ValueError, match="have 3 coordinates in all"):
        rd.Factor(factor.relation, {"x": 1, "y": 2})

    def bad_precision(p):
        return factor.query({"w": rd.Unobserved(1.0, p)})[1]

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
    nodes = rd.field_nodes(jax.random.key(3), 3, samples=2)
    rel = rd.ImplicitDiffusion(mix, nodes, lam=rd.density_lambda(SCHED, nodes))
    factor = rd.Factor(rel, {"a": 1, "b": 1, "c": 1})
    zbar = {"b": jnp.asarray(0.7), "c": jnp.asarray(-1.3)}

    def marks_of(x, v, p):
        return {
            "a": rd.Observed(x),
            "b": rd.Unobserved(v, p),
            "c": rd.Latent(jnp.asarray(0.2)),
        }

    @jax.jit
    def loss(f, x, v, p):
        sol = rd.factor_infer(f, marks_of(x, v, p), tol=1e-13)
        z = f.split(sol.z)
        return 0.7 * z["b"][0] - 1.3 * z["c"][0]

    args = (jnp.asarray(0.4), jnp.asarray(0.3), jnp.asarray(2.0))
    marks = marks_of(*args)
    sol = rd.factor_infer(factor, marks, tol=1e-13)
    factor_bar, marks_bar = rd.factor_pullback(factor, sol, marks, zbar)
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
    g = rd.MomentGaussian(mean, cov)
    c = g.canonical()
    assert_close(c.moment().mean, mean, rtol=1e-12)
    assert_close(c.moment().cov, cov, rtol=1e-12)
    # the Schur complement of the canonical form is the moment marginal
    assert_close(c.marginal([2, 0]).moment().mean, mean[jnp.array([2, 0])], 1e-12)
    assert_close(c.marginal([2, 0]).moment().cov, cov[np.ix_([2, 0], [2, 0])], 1e-12)
    # product and quotient
    other = rd.MomentGaussian(-mean, 2 * cov)
    prod = rd.combine(g, other)
    assert_close(prod.precision, c.precision + other.canonical().precision)
    back = rd.divide(prod, other)
    assert_close(back.info, c.info, rtol=1e-12)
    assert_close(back.precision, c.precision, rtol=1e-12)
    with pytest.raises(ValueError, match="different dimensions"):
        rd.combine(g, g.marginal([0]))
    with pytest.raises(ValueError, match="repeats a coordinate"):
        g.marginal([1, 1])


def test_marginal_beliefs_are_the_joint_gaussians_marginals():
    factor, prec, mean = gaussian_factor()
    marks = {
        "x": rd.Unobserved(jnp.asarray(0.5), jnp.asarray(3.0)),
        "w": rd.Unobserved(jnp.asarray(-0.2), jnp.asarray(0.5)),
    }
    z0, rho = factor.query(marks)
    sol = rd.factor_infer(factor, marks)
    p_anchor = jnp.array([3.0, 0.0, 0.0, 0.5])
    post_mean, post_cov = closed_posterior(prec, mean, z0, p_anchor)
    coords = factor.coords("y", "x")
    # (under `jit`: the Laplace covariance one program, not op by op)
    belief = eqx.filter_jit(rd.laplace_belief)(factor, sol, rho, coords)
    idx = np.asarray(coords)
    assert_close(belief.mean, post_mean[idx], rtol=1e-12)
    assert_close(belief.cov, post_cov[np.ix_(idx, idx)], rtol=1e-12)
    assert_close(belief.canonical().moment().cov, belief.cov, rtol=1e-11)


@pytest.mark.slow
def test_mixture_finds_its_roots_and_marginalises():
    factor, prec, mean = gaussian_factor()
    marks = {"x": rd.Unobserved(jnp.asarray(0.5), jnp.asarray(3.0))}
    z0, rho = factor.query(marks)
    post_mean, post_cov = closed_posterior(
        prec, mean, z0, jnp.array([3.0, 0.0, 0.0, 0.0])
    )
    coords = factor.coords("w", "y")
    idx = np.asarray(coords)
    key = jax.random.key(0)
    mixture = rd.implicit_mixture(
        factor, None, z0, rho, coords=coords, key=key, n_starts=3
    )
    # one root (a Gaussian), found from every start
    assert_close(mixture.weights, jnp.array([1.0, 0.0, 0.0]), atol=1e-15)
    assert_close(mixture.means[0], post_mean[idx], rtol=1e-12)
    assert_close(mixture.covs[0], post_cov[np.ix_(idx, idx)], rtol=1e-12)
    roots = rd.implicit_roots(factor, z0, rho, key=key, n_starts=3)
    given = rd.implicit_mixture(factor, roots, z0, rho).marginal(coords)
    # (invalid slots' covariances are NaN, as in implicit_laplace)
    assert_close(given.weights, mixture.weights, rtol=1e-14)
    assert_close(given.means[0], mixture.means[0], rtol=1e-14)
    assert_close(given.covs[0], mixture.covs[0], rtol=1e-14)
    with pytest.raises(ValueError, match="are for finding roots"):
        rd.implicit_mixture(factor, roots, z0, rho, key=key)


def test_message_times_anchor_is_the_posterior():
    factor, prec, mean = gaussian_factor()
    marks = {
        "x": rd.Observed(jnp.asarray(0.5)),
        "y": rd.Unobserved(jnp.array([0.1, 0.4]), jnp.array([2.0, 0.7])),
        "w": rd.Unobserved(jnp.asarray(-0.2), jnp.asarray(0.5)),
    }
    z0, _ = factor.query(marks)
    sol = rd.factor_infer(factor, marks)
    messages = rd.factor_messages(factor, sol, marks)
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
        anchor = rd.channel_anchor(factor, marks, name)
        posterior = rd.combine(messages[name], anchor).moment()
        s = np.asarray(sub)
        assert_close(posterior.mean, post_mean[s], rtol=1e-12)
        assert_close(posterior.cov, post_cov[np.ix_(s, s)], rtol=1e-12)
        # and the message is the relation's marginal likelihood of the channel
        # given the other channels' anchors (belief propagation's message)
        with_others = closed_posterior(
            cond_prec, cond_mean, z0[free], p_anchor.at[s].set(0.0)
        )
        expected = rd.MomentGaussian(*with_others).marginal(sub).canonical()
        assert_close(messages[name].precision, expected.precision, rtol=1e-11)
        assert_close(messages[name].info, expected.info, rtol=1e-11)
    points = rd.factor_messages(factor, sol, marks, kind="point")
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
        marks = {"w": rd.Unobserved(jnp.asarray(value), jnp.asarray(p))}
        z0, rho = factor.query(marks)
        sol = rd.factor_infer(factor, marks)
        f = rd.local_free_energy(factor, sol, z0, rho)
        assert_close(f, evidence(z0, jnp.array([0.0, 0.0, 0.0, p])), rtol=1e-12)
        assert abs(float(f)) > 0.1
