"""Factors with channels and their pullback."""

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
