"""Kernel density estimates as exact noise predictors: batch and streaming."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._errors import error_if
from .._validate import check_positive_int, check_value
from ._mixture import GaussianMixtureEps
from ._schedule import AbstractNoiseSchedule
from ._state import as_state


def kde_predictor(
    schedule: AbstractNoiseSchedule,
    data: Float[ArrayLike, "num n"],
    bandwidth: Float[ArrayLike, ""] | float,
) -> GaussianMixtureEps:
    r"""The exact noise predictor of a Gaussian kernel density estimate.

    The KDE $\tfrac1N \sum_i N(x_i, h^2 I)$ is a mixture with one component
    per data point, so its noise predictor is exact
    ([`retrax.diffusion.GaussianMixtureEps`][]): a training-free model of the
    data, accurate where the data are dense.

    **Arguments:**

    - `schedule`: the noise schedule.
    - `data`: the points, shape `(num, n)`.
    - `bandwidth`: the kernel standard deviation $h$ (e.g. from
      [`retrax.diffusion.kde_bandwidth`][]).

    **Returns:**

    A `GaussianMixtureEps` with equal weights.
    """
    return GaussianMixtureEps(schedule, data, bandwidth)


@jax.jit
def _kde_heldout_loglik(train, test, hs):
    n = train.shape[1]
    d2 = jnp.sum((test[:, None, :] - train[None, :, :]) ** 2, axis=-1)

    def mean_loglik(h):
        log_norm = 0.5 * n * jnp.log(2 * jnp.pi * h**2) + jnp.log(train.shape[0])
        return jnp.mean(jax.nn.logsumexp(-0.5 * d2 / h**2, axis=1) - log_norm)

    return jax.vmap(mean_loglik)(hs)


def kde_bandwidth(
    data: Float[ArrayLike, "num n"],
    holdout: float = 0.2,
    *,
    key: PRNGKeyArray | None = None,
    candidates: Float[ArrayLike, " k"] | None = None,
) -> Float[Array, ""]:
    r"""Choose a KDE bandwidth by held-out likelihood.

    A random fraction `holdout` of the points is set aside; the bandwidth is
    the candidate maximising the mean log-density of the held-out points under
    the KDE of the rest. The default candidates are 49 log-spaced values
    from $10^{-3}$ to $10^{1/2}$ times the data's scale (the root mean
    coordinate variance), refined by a second grid of 25 around the best.

    **Arguments:**

    - `data`: the points, shape `(num, n)`, at least 2 of them.
    - `holdout`: the held-out fraction, in `(0, 1)`.
    - `key`: a PRNG key for the split; a fixed key by default, so the result
      is deterministic.
    - `candidates`: explicit positive bandwidths to choose from instead.

    **Returns:**

    The chosen bandwidth, a scalar.
    """
    data = as_state("data", data)
    if data.ndim != 2 or data.shape[0] < 2:
        raise ValueError(
            "`data` must have shape (num, n) with at least 2 points, got shape "
            f"{data.shape}."
        )
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"`holdout` must lie in (0, 1), got {holdout}.")
    data = check_value(data, lambda xp, v: ~xp.isfinite(v), "`data` must be finite.")
    num = data.shape[0]
    n_test = min(max(1, round(holdout * num)), num - 1)
    key = jax.random.key(0) if key is None else key
    perm = jax.random.permutation(key, num)
    test, train = data[perm[:n_test]], data[perm[n_test:]]

    def score(hs):
        return _kde_heldout_loglik(train, test, hs)

    if candidates is not None:
        cands = as_state("candidates", candidates).astype(data.dtype)
        if cands.ndim != 1 or cands.shape[0] == 0:
            raise ValueError("`candidates` must be a non-empty vector.")
        cands = check_value(
            cands,
            lambda xp, v: ~(v > 0) | ~xp.isfinite(v),
            "`candidates` must be positive, finite bandwidths.",
        )
        return cands[jnp.argmax(score(cands))]
    scale = jnp.sqrt(jnp.mean(jnp.var(data, axis=0)))
    scale = jnp.where(scale > 0, scale, 1.0)
    coarse = scale * jnp.logspace(-3.0, 0.5, 49, dtype=data.dtype)
    best = coarse[jnp.argmax(score(coarse))]
    ratio = jnp.asarray(10.0 ** (3.5 / 48), data.dtype)
    fine = best * jnp.logspace(-1.0, 1.0, 25, dtype=data.dtype) ** jnp.log10(ratio)
    return fine[jnp.argmax(score(fine))]


class OnlineKDE(eqx.Module):
    r"""A fixed-budget Gaussian mixture that absorbs a stream of observations.

    Each [`retrax.diffusion.OnlineKDE.observe`][], in order:

    1. multiplies every weight by `forget`: a point observed $k$ observations
       ago carries weight $\mathrm{forget}^k$ (`forget = 1` remembers
       everything, equally);
    2. merges the new point into the nearest component if it lies within
       `merge_radius` (the mean moves to the weight-averaged mean, the weight
       grows by 1), and otherwise gives it a component of its own with
       weight 1;
    3. frees the components whose weight fell below `prune` times the
       heaviest weight;
    4. if more than `budget` components remain, merges the lightest into its
       nearest neighbour (weight-averaged mean, weights added).

    No mass is lost to the budget: with `forget = 1` and `prune = 0` the
    weights sum to the number of points observed. Array sizes never change
    (`budget` slots, free ones with weight 0), so `observe` jits and scans; it
    returns a new object (functional update).

    **Arguments:**

    - `dim`: the dimension `n` of the points.
    - `budget`: the number of components.
    - `bandwidth`: every component's standard deviation.
    - `forget`: the per-observation weight decay, in `(0, 1]`.
    - `merge_radius`: the merge distance; the bandwidth by default.
    - `prune`: the weight, relative to the heaviest component's, below which
      a component is freed, in `[0, 1]`; 0 never frees one. A new point's
      own weight is 1, so an isolated new point is freed at once while the
      heaviest weight exceeds `1 / prune` (with `forget = 1` and a long
      stream).
    - `dtype`: JAX's default float by default.
    """

    means: Float[Array, "budget n"]
    weights: Float[Array, " budget"]
    bandwidth: float | Float[Array, ""]
    forget: float | Float[Array, ""]
    merge_radius: float | Float[Array, ""]
    prune: float | Float[Array, ""]

    def __init__(
        self,
        dim: int,
        budget: int,
        bandwidth: float | Float[ArrayLike, ""],
        *,
        forget: float | Float[ArrayLike, ""] = 0.99,
        merge_radius: float | Float[ArrayLike, ""] | None = None,
        prune: float | Float[ArrayLike, ""] = 1e-3,
        dtype=None,
    ):
        check_positive_int("dim", dim)
        check_positive_int("budget", budget)
        bandwidth = check_value(
            bandwidth,
            lambda xp, v: ~(v > 0) | ~xp.isfinite(v),
            "`bandwidth` must be positive and finite.",
        )
        forget = check_value(
            forget, lambda xp, v: ~((v > 0) & (v <= 1)), "`forget` must lie in (0, 1]."
        )
        merge_radius = bandwidth if merge_radius is None else merge_radius
        merge_radius = check_value(
            merge_radius, lambda xp, v: ~(v >= 0), "`merge_radius` must be nonnegative."
        )
        prune = check_value(
            prune, lambda xp, v: ~((v >= 0) & (v <= 1)), "`prune` must lie in [0, 1]."
        )
        dtype = jnp.result_type(float) if dtype is None else dtype
        self.means = jnp.zeros((budget, dim), dtype)
        self.weights = jnp.zeros((budget,), dtype)
        self.bandwidth, self.forget, self.merge_radius, self.prune = (
            v if isinstance(v, jax.Array) else float(v)
            for v in (bandwidth, forget, merge_radius, prune)
        )

    def observe(self, x: Float[ArrayLike, " n"]) -> "OnlineKDE":
        """Absorb one observation.

        **Arguments:**

        - `x`: the point, shape `(n,)`; must be finite.

        **Returns:**

        The updated `OnlineKDE` (this one is unchanged).
        """
        x = as_state("x", x)
        if x.shape != self.means.shape[1:]:
            raise ValueError(
                f"`x` must have shape {self.means.shape[1:]}, got {x.shape}."
            )
        x = error_if(
            x, ~jnp.all(jnp.isfinite(x)), "the observation `x` must be finite."
        )
        dtype = self.means.dtype
        x = x.astype(dtype)
        budget = self.weights.shape[0]
        zero, one = jnp.zeros((), dtype), jnp.ones((), dtype)
        w = self.weights * self.forget
        live = w > 0
        d2 = jnp.where(live, jnp.sum((self.means - x) ** 2, axis=1), jnp.inf)
        near = jnp.argmin(d2)
        merge = d2[near] <= self.merge_radius**2
        merged = (w[near] * self.means[near] + x) / (w[near] + 1)
        # The new point as slot `budget` of a list one longer than the budget;
        # it is empty when the point was merged.
        means = jnp.concatenate(
            [
                self.means.at[near].set(jnp.where(merge, merged, self.means[near])),
                x[None],
            ]
        )
        w = jnp.concatenate(
            [
                w.at[near].add(jnp.where(merge, one, zero)),
                jnp.where(merge, zero, one)[None],
            ]
        )
        w = jnp.where(w < self.prune * jnp.max(w), zero, w)
        live = w > 0
        # Over budget (every slot and the new point live): merge the lightest
        # into its nearest neighbour. Ties go to the lowest slot, the new
        # point last.
        over = jnp.sum(live) > budget
        light = jnp.argmin(jnp.where(live, w, jnp.inf))
        d2 = jnp.sum((means - means[light]) ** 2, axis=1)
        d2 = jnp.where(live & (jnp.arange(budget + 1) != light), d2, jnp.inf)
        host = jnp.argmin(d2)
        w_sum = w[host] + w[light]
        safe = jnp.where(over, w_sum, one)
        pooled = (w[host] * means[host] + w[light] * means[light]) / safe
        means = means.at[host].set(jnp.where(over, pooled, means[host]))
        w = w.at[host].set(jnp.where(over, w_sum, w[host]))
        w = w.at[light].set(jnp.where(over, zero, w[light]))
        # The new point, if it still stands alone, moves into the first free
        # slot (one exists: at most `budget` components are live now).
        free = jnp.argmax(w[:budget] <= 0)
        move = w[budget] > 0
        means = means[:budget].at[free].set(jnp.where(move, means[budget], means[free]))
        w = w[:budget].at[free].set(jnp.where(move, w[budget], w[free]))
        return eqx.tree_at(lambda k: (k.means, k.weights), self, (means, w))

    def predictor(self, schedule: AbstractNoiseSchedule) -> GaussianMixtureEps:
        """The exact noise predictor of the current mixture.

        **Arguments:**

        - `schedule`: the noise schedule.

        **Returns:**

        A [`retrax.diffusion.GaussianMixtureEps`][] over all slots (free slots
        have weight 0). Raises if nothing has been observed yet (also under
        `jit`).
        """
        weights = error_if(
            self.weights,
            ~jnp.any(self.weights > 0),
            "`OnlineKDE.predictor` needs at least one observation: every weight "
            "is zero (call `observe` first).",
        )
        return GaussianMixtureEps(schedule, self.means, self.bandwidth, weights)
