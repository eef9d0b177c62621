"""Queries in batches fail one by one, and full precisions as evidence."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
import retrax.relations as rr


SCHED = rd.VPSDE()


def ring_factor():
    """A ring of 48 Gaussian lumps (a closed-form predictor) over x and y."""
    ang = 2 * np.pi * np.arange(48) / 48
    means = jnp.asarray(np.stack([np.cos(ang), np.sin(ang)], 1))
    mix = rd.GaussianMixtureEps(SCHED, means, jnp.asarray(0.05))
    nodes = rd.field_nodes(jax.random.key(0), 2, samples=8)
    return rr.Factor(rr.ImplicitDiffusion(mix, nodes), {"x": 1, "y": 1})


def batch(factor, xs, starts, precisions, throw=False):
    def one(x, start, p):
        marks = {"x": rr.Observed(x), "y": rr.Latent(start)}
        return rr.factor_infer(factor, marks, throw=throw)

    def soft(x, start, p):
        marks = {"x": rr.Unobserved(x, p), "y": rr.Latent(start)}
        return rr.factor_infer(factor, marks, throw=throw)

    return jax.vmap(one)(xs, starts, precisions), jax.vmap(soft)(xs, starts, precisions)


@pytest.mark.parametrize("what", ["clamp", "start", "precision"])
def test_one_bad_query_fails_alone(what):
    factor = ring_factor()
    n, bad = 64, 17
    xs = jnp.linspace(-0.8, 0.8, n)
    starts = jnp.full((n,), 0.5)
    precisions = jnp.full((n,), 4.0)
    good_hard, good_soft = batch(factor, xs, starts, precisions)
    assert bool(jnp.all(good_hard.result == rd.RESULTS.successful))
    assert bool(jnp.all(good_soft.result == rd.RESULTS.successful))
    if what == "clamp":
        xs = xs.at[bad].set(jnp.nan)
    elif what == "start":
        starts = starts.at[bad].set(jnp.nan)
    else:
        precisions = precisions.at[bad].set(-1.0)
    hard, soft = batch(factor, xs, starts, precisions)
    keep = np.arange(n) != bad
    # a bad precision is a bad query only where the precision is read
    failing = [soft] if what == "precision" else [hard, soft]
    for sol, good in [(hard, good_hard), (soft, good_soft)]:
        ok = keep if sol in failing else np.ones(n, bool)
        if sol in failing:
            assert bool((sol.result == rd.RESULTS.invalid_query)[bad])
            assert bool(jnp.all(jnp.isnan(sol.z[bad])))
            assert not bool(sol.converged[bad])
            assert bool(jnp.isnan(sol.clamp_load[bad]))
        assert bool(jnp.all((sol.result == rd.RESULTS.successful)[ok]))
        np.testing.assert_allclose(sol.z[ok], good.z[ok], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(sol.steps[ok], good.steps[ok])


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


def test_bad_query_gradients_are_nan_alone():
    factor = ring_factor()
    xs = jnp.linspace(-0.8, 0.8, 4)

    def answers(xs):
        def one(x):
            marks = {"x": rr.Observed(x), "y": rr.Latent(0.5)}
            return rr.factor_infer(factor, marks, throw=False).z[1]

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
