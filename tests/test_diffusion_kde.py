"""Kernel density estimates as exact predictors, and the online fixed-budget KDE."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
from helpers import assert_close, raises_eagerly_and_under_jit


SCHED = rd.VPSDE()


def test_kde_predictor_is_mixture_of_points(getkey):
    data = jax.random.normal(getkey(), (50, 2))
    kde = rd.kde_predictor(SCHED, data, 0.2)
    x, t = jnp.array([0.1, -0.3]), 0.05
    # direct KDE log-density of the noised data, written here
    a, s = SCHED.alpha(t), SCHED.sigma(t)
    c = a**2 * 0.04 + s**2
    d2 = jnp.sum((x - a * data) ** 2, axis=1)
    ref = jax.nn.logsumexp(-0.5 * d2 / c) - jnp.log(50.0) - jnp.log(2 * jnp.pi * c)
    assert_close(rd.mixture_logdensity(kde, x, t), ref, rtol=1e-13)
    grad = jax.grad(lambda x: rd.mixture_logdensity(kde, x, t))(x)
    assert_close(kde.epsilon(x, t), -s * grad, rtol=1e-12)


def heldout(train, test, h):
    d2 = ((test[:, None] - train[None]) ** 2).sum(-1)
    n = train.shape[1]
    lse = np.log(np.exp(-0.5 * d2 / h**2).sum(1))
    return np.mean(lse - 0.5 * n * np.log(2 * np.pi * h**2) - np.log(len(train)))


def test_kde_bandwidth_maximises_heldout_likelihood():
    data = jax.random.normal(jax.random.key(0), (1000, 2))
    h = float(rd.kde_bandwidth(data))
    # Silverman's rule for a 2-D standard normal: N^(-1/6)
    silverman = 1000 ** (-1 / 6)
    assert 0.5 * silverman < h < 2 * silverman
    # the same split, scored independently in numpy: h beats its neighbours
    perm = np.asarray(jax.random.permutation(jax.random.key(0), 1000))
    d = np.asarray(data)
    test, train = d[perm[:200]], d[perm[200:]]
    best = heldout(train, test, h)
    for factor in [0.8, 0.95, 1.05, 1.25]:
        assert best >= heldout(train, test, factor * h)
    cands = jnp.array([0.01, 0.3, 3.0])
    assert float(rd.kde_bandwidth(data, candidates=cands)) == 0.3
    # a scaled data set scales the bandwidth exactly: the candidates scale with
    # the data, and the held-out log-likelihood only shifts by n log 10, so the
    # same candidate wins (up to rounding)
    h10 = float(rd.kde_bandwidth(10 * data))
    assert_close(h10, 10 * h, rtol=1e-12)


def test_kde_bandwidth_errors():
    with pytest.raises((ValueError, TypeError), match="at least 2|shape"):
        rd.kde_bandwidth(jnp.zeros((1, 2)))
    with pytest.raises(ValueError, match="holdout"):
        rd.kde_bandwidth(jnp.zeros((10, 2)), holdout=1.0)
    data = jax.random.normal(jax.random.key(0), (10, 2)).at[3, 1].set(jnp.nan)
    raises_eagerly_and_under_jit(rd.kde_bandwidth, data, match="`data` must be finite")
    raises_eagerly_and_under_jit(
        lambda c: rd.kde_bandwidth(jnp.nan_to_num(data), candidates=c),
        jnp.array([0.1, -0.3]),
        match="`candidates` must be positive, finite bandwidths",
    )


def reference_observe(means, weights, x, forget, radius, prune):
    """The documented update rule, in plain numpy."""
    means, weights = means.copy(), weights * forget
    weights[weights < prune] = 0.0
    live = np.flatnonzero(weights > 0)
    if live.size:
        d = np.sqrt(((means[live] - x) ** 2).sum(1))
        j = live[np.argmin(d)]
        if d.min() <= radius:
            means[j] = (weights[j] * means[j] + x) / (weights[j] + 1)
            weights[j] += 1
            return means, weights
    k = int(np.argmin(weights))
    means[k], weights[k] = x, 1.0
    return means, weights


def test_online_kde_against_reference():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [-2.0, -2.0]])
    stream = centres[rng.integers(0, 4, 80)] + 0.1 * rng.normal(size=(80, 2))
    stream[40:] += 3.0  # the distribution moves: old components must be reused
    kde = rd.OnlineKDE(2, 5, 0.2, forget=0.9, merge_radius=0.3, prune=0.05)
    observe = jax.jit(lambda k, x: k.observe(x))
    means, weights = np.zeros((5, 2)), np.zeros(5)
    for x in stream:
        kde = observe(kde, jnp.asarray(x))
        means, weights = reference_observe(means, weights, x, 0.9, 0.3, 0.05)
        assert_close(kde.weights, weights, rtol=1e-12)
        assert_close(kde.means, means, rtol=1e-12)
    # a scan over the stream gives the same state
    fresh = rd.OnlineKDE(2, 5, 0.2, forget=0.9, merge_radius=0.3, prune=0.05)
    scanned, _ = jax.lax.scan(lambda k, x: (k.observe(x), None), fresh, stream)
    assert_close(scanned.means, kde.means, rtol=1e-12)


def test_online_kde_merge_prune_and_budget():
    kde = rd.OnlineKDE(1, 2, 0.1, forget=0.5, merge_radius=0.2, prune=0.1)
    kde = kde.observe(jnp.array([0.0]))
    kde = kde.observe(jnp.array([0.1]))  # merged: weight 0.5 + 1
    assert_close(kde.weights, jnp.array([1.5, 0.0]))
    assert_close(kde.means[0], jnp.array([0.1 / 1.5]))
    kde = kde.observe(jnp.array([5.0]))  # new slot: weights 0.75, 1
    kde = kde.observe(jnp.array([-5.0]))  # budget full: the lightest is reused
    assert_close(kde.weights, jnp.array([1.0, 0.5]))
    assert_close(kde.means[:, 0], jnp.array([-5.0, 5.0]))
    for _ in range(3):  # slot 1: 0.25, 0.125, then 0.0625 < prune: freed
        kde = kde.observe(jnp.array([-5.0]))
    assert_close(kde.weights, jnp.array([1.875, 0.0]))
    # the freed slot no longer contributes
    x = jnp.array([-4.9])
    one = rd.GaussianMixtureEps(SCHED, jnp.array([[-5.0]]), 0.1)
    assert_close(kde.predictor(SCHED).epsilon(x, 0.1), one.epsilon(x, 0.1))


def test_online_kde_errors():
    with pytest.raises(ValueError, match="`budget` must be a positive integer"):
        rd.OnlineKDE(2, 0, 0.1)
    x = jnp.array([0.1, -0.2])

    def eps(bandwidth, forget, merge_radius, prune):
        kde = rd.OnlineKDE(
            2, 3, bandwidth, forget=forget, merge_radius=merge_radius, prune=prune
        )
        return kde.observe(x).observe(-x).predictor(SCHED).epsilon(x, 0.1)

    # the value checks hold eagerly and under `jit` (traced arguments)
    good = (0.1, 0.9, 0.2, 1e-3)
    for i, bad, match in [
        (0, 0.0, "`bandwidth` must be positive"),
        (0, jnp.nan, "`bandwidth` must be positive"),
        (1, 1.5, r"`forget` must lie in \(0, 1\]"),
        (1, 0.0, r"`forget` must lie in \(0, 1\]"),
        (2, -0.1, "`merge_radius` must be nonnegative"),
        (3, -1.0, "`prune` must be nonnegative"),
    ]:
        args = good[:i] + (bad,) + good[i + 1 :]
        raises_eagerly_and_under_jit(eps, *args, match=match)
    assert jnp.all(jnp.isfinite(jax.jit(eps)(*good)))
    kde = rd.OnlineKDE(2, 3, 0.1)
    with pytest.raises((ValueError, TypeError), match="shape"):
        kde.observe(jnp.zeros(3))
    with pytest.raises(Exception, match="finite"):
        kde.observe(jnp.array([jnp.nan, 0.0]))
    # nothing observed yet: every weight is zero
    raises_eagerly_and_under_jit(
        lambda k: k.predictor(SCHED).epsilon(x, 0.1),
        kde,
        match="`OnlineKDE.predictor` needs at least one observation",
    )
