"""Kernel density estimates as exact predictors, and the online fixed-budget KDE."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
import retrax.relations as rr
from helpers import assert_close, raises_eagerly_and_under_jit


SCHED = rd.VPSDE()


@pytest.mark.full
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


@pytest.mark.full
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
    """The documented update rule, in plain numpy, on a growing list of
    components (the library keeps fixed slots; compare as sets)."""
    means, weights = means.copy(), weights * forget
    if len(weights):
        d = np.sqrt(((means - x) ** 2).sum(1))
        j = int(np.argmin(d))
        if d[j] <= radius:
            means[j] = (weights[j] * means[j] + x) / (weights[j] + 1)
            weights[j] += 1
            x = None
    if x is not None:
        means, weights = np.vstack([means, x]), np.append(weights, 1.0)
    keep = weights >= prune * weights.max()
    return means[keep], weights[keep], int(np.sum(~keep))


def reference_budget(means, weights, budget):
    """Past the budget, the lightest component joins its nearest neighbour."""
    while len(weights) > budget:
        j = int(np.argmin(weights))
        d = ((means - means[j]) ** 2).sum(1)
        d[j] = np.inf
        i = int(np.argmin(d))
        means[i] = (weights[i] * means[i] + weights[j] * means[j]) / (
            weights[i] + weights[j]
        )
        weights[i] += weights[j]
        means, weights = np.delete(means, j, 0), np.delete(weights, j)
    return means, weights


def as_set(means, weights):
    """The live components, sorted by weight."""
    means, weights = np.asarray(means), np.asarray(weights)
    live = weights > 0
    order = np.argsort(weights[live])
    return means[live][order], weights[live][order]


def test_online_kde_against_reference():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [-2.0, -2.0]])
    stream = centres[rng.integers(0, 4, 80)] + 0.1 * rng.normal(size=(80, 2))
    stream[40:] += 3.0  # the distribution moves: old components must be reused
    kde = rd.OnlineKDE(2, 5, 0.2, forget=0.9, merge_radius=0.3, prune=0.15)
    means, weights = np.zeros((0, 2)), np.zeros(0)
    merged = pruned = 0
    for x in stream:
        kde = observe(kde, jnp.asarray(x))
        means, weights, freed = reference_observe(means, weights, x, 0.9, 0.3, 0.15)
        pruned += freed
        merged += len(weights) > 5
        means, weights = reference_budget(means, weights, 5)
        got_means, got_weights = as_set(kde.means, kde.weights)
        assert_close(got_weights, np.sort(weights), rtol=1e-12)
        assert_close(got_means, means[np.argsort(weights)], rtol=1e-12)
    # the stream exercises both the budget merge and relative pruning
    assert merged > 0 and pruned > 0
    # a scan over the stream gives the same state
    fresh = rd.OnlineKDE(2, 5, 0.2, forget=0.9, merge_radius=0.3, prune=0.15)
    scanned, _ = jax.lax.scan(lambda k, x: (k.observe(x), None), fresh, stream)
    assert_close(scanned.means, kde.means, rtol=1e-12)
    assert_close(scanned.weights, kde.weights, rtol=1e-12)


observe = jax.jit(lambda kde, x: kde.observe(x))


def test_online_kde_merge_prune_and_budget():
    kde = rd.OnlineKDE(1, 2, 0.1, forget=0.5, merge_radius=0.2, prune=0.1)
    kde = observe(kde, jnp.array([0.0]))
    kde = observe(kde, jnp.array([0.1]))  # merged: weight 0.5 + 1
    assert_close(kde.weights, jnp.array([1.5, 0.0]))
    assert_close(kde.means[0], jnp.array([0.1 / 1.5]))
    kde = observe(kde, jnp.array([5.0]))  # new slot: weights 0.75, 1
    assert_close(kde.weights, jnp.array([0.75, 1.0]))
    # Budget full: the lightest (0.375 at 0.1/1.5) joins its nearest
    # neighbour (0.5 at 5.0), and the new point takes the freed slot.
    kde = observe(kde, jnp.array([-5.0]))
    assert_close(kde.weights, jnp.array([1.0, 0.875]))
    pooled = (0.5 * 5.0 + 0.375 * 0.1 / 1.5) / 0.875
    assert_close(kde.means[:, 0], jnp.array([-5.0, pooled]))
    # slot 1: 0.4375, 0.21875, then 0.109375 < 0.1 * 1.875 (relative to the
    # heaviest weight): freed
    for _ in range(3):
        kde = observe(kde, jnp.array([-5.0]))
    assert_close(kde.weights, jnp.array([1.875, 0.0]))
    # the freed slot no longer contributes
    x = jnp.array([-4.9])
    one = rd.GaussianMixtureEps(SCHED, jnp.array([[-5.0]]), 0.1)
    assert_close(kde.predictor(SCHED).epsilon(x, 0.1), one.epsilon(x, 0.1))
    # pruning is relative to the heaviest weight: next to a component of
    # weight 20, a new point (weight 1 < 0.1 * 20) is freed at once
    heavy = rd.OnlineKDE(1, 2, 0.1, forget=1.0, merge_radius=0.5, prune=0.1)
    for x in [0.0] * 20 + [5.0]:
        heavy = observe(heavy, jnp.array([x]))
    assert_close(heavy.weights, jnp.array([20.0, 0.0]))
    assert_close(heavy.means[0], jnp.array([0.0]))


def test_online_kde_keeps_its_mass():
    """Over budget nothing is dropped: 200 points into 25 components keep a
    total weight of 200 and the stream's mean (VariationalDiffusion.jl's test,
    with its defaults `merge_radius = bandwidth / 2` and `prune = 1e-4`)."""
    data = np.random.default_rng(6).normal(size=(200, 2))
    kde = rd.OnlineKDE(2, 25, 0.05, forget=1.0, merge_radius=0.025, prune=1e-4)
    kde, _ = jax.lax.scan(lambda k, x: (k.observe(x), None), kde, data)
    assert int(jnp.sum(kde.weights > 0)) == 25
    assert_close(jnp.sum(kde.weights), 200.0, rtol=1e-12)
    # merging keeps first moments: the mixture's mean is the data's mean
    assert_close(kde.weights @ kde.means / 200, data.mean(0), rtol=1e-12)
    # with forgetting (and no pruning) the mass and the mean are the
    # exponentially weighted ones
    kde = rd.OnlineKDE(2, 25, 0.05, forget=0.98, merge_radius=0.025, prune=0.0)
    kde, _ = jax.lax.scan(lambda k, x: (k.observe(x), None), kde, data)
    decay = 0.98 ** np.arange(199, -1, -1)
    assert_close(jnp.sum(kde.weights), decay.sum(), rtol=1e-12)
    assert_close(kde.weights @ kde.means, decay @ data, rtol=1e-12)


def drifting_circle(count=1200, seed=4):
    """A circle whose radius grows from 1.0 to 1.5 over the stream."""
    rng = np.random.default_rng(seed)
    phi = 2 * np.pi * rng.random(count)
    radius = 1 + 0.5 * np.arange(1, count + 1) / count
    ring = np.stack([np.cos(phi), np.sin(phi)], 1)
    return radius[:, None] * ring + 0.02 * rng.normal(size=(count, 2))


def stream_kde(stream, forget):
    kde = rd.OnlineKDE(2, 300, 0.05, forget=forget, merge_radius=0.025, prune=1e-4)
    kde, _ = jax.lax.scan(lambda k, x: (k.observe(x), None), kde, stream)
    return kde


def test_online_kde_follows_a_drift():
    """The mixture itself, without a query: remembering averages the whole
    stream's radius, forgetting tracks the latest one."""
    stream = drifting_circle()
    radii = np.linalg.norm(stream, axis=1)
    for forget in [1.0, 0.99]:
        kde = stream_kde(stream, forget)
        assert int(jnp.sum(kde.weights > 0)) == 300
        w = np.asarray(kde.weights)
        mean_radius = w @ np.linalg.norm(np.asarray(kde.means), axis=1) / w.sum()
        decay = forget ** np.arange(len(radii) - 1, -1, -1)
        # merges pool nearby points only (within 0.025, or the nearest
        # neighbour among 300 components), so the radius moves little
        assert abs(mean_radius - decay @ radii / decay.sum()) < 0.01


@pytest.mark.slow
def test_online_kde_drifting_circle_query():
    """VariationalDiffusion.jl's drifting-circle test: y given x = 0 from the
    streamed mixture, the largest of its answers. Without forgetting the
    answer averages the history (it used to freeze near the first radius);
    with `forget = 0.99` it tracks the current radius 1.5."""
    stream = drifting_circle()
    nodes = rr.field_nodes(jax.random.key(1), 2, samples=4)

    @jax.jit
    def answer(kde):
        model = rr.ImplicitDiffusion(kde.predictor(SCHED), nodes)
        z0, rho = jnp.zeros(2), jnp.array([jnp.inf, 0.0])
        roots = rr.implicit_roots(model, z0, rho, jax.random.key(0), 13, 1.5)
        return jnp.max(jnp.where(roots.valid, roots.value[:, 1], -jnp.inf))

    assert 1.1 < float(answer(stream_kde(stream, 1.0))) < 1.35
    assert abs(float(answer(stream_kde(stream, 0.99))) - 1.5) < 0.08


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
        (3, -1.0, r"`prune` must lie in \[0, 1\]"),
        (3, 1.5, r"`prune` must lie in \[0, 1\]"),
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
