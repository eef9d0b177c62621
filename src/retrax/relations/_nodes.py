"""Field nodes: the fixed noise levels and noise draws an implicit field averages."""

import functools
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._errors import error_if
from .._validate import check_positive_int, check_value
from ..diffusion import AbstractNoiseSchedule


class FieldNodes(eqx.Module):
    r"""A fixed set of $K$ field nodes $(t_k, e_k, w_k)$.

    The implicit field of [`retrax.relations.ImplicitDiffusion`][] is a
    weighted sum over these nodes of the denoising residual
    $\hat\epsilon(\alpha_k z + \sigma_k e_k, t_k) - e_k$. Fixing the nodes
    makes the field a deterministic function of $z$, so it has roots and a
    Jacobian.

    **Arguments:**

    - `t`: the diffusion times, shape `(K,)`, in `(0, 1]`.
    - `eps`: the noise draws, shape `(K, n)`.
    - `w`: the nonnegative node weights, shape `(K,)`.
    """

    t: Float[Array, " _K"]
    eps: Float[Array, "_K n"]
    w: Float[Array, " _K"]

    def __init__(
        self,
        t: Float[ArrayLike, " _K"],
        eps: Float[ArrayLike, "_K n"],
        w: Float[ArrayLike, " _K"],
    ):
        if not (hasattr(t, "ndim") and hasattr(eps, "ndim") and hasattr(w, "ndim")):
            raise ValueError("`t`, `eps` and `w` must be arrays.")
        if eps.ndim != 2 or eps.shape[0] == 0 or eps.shape[1] == 0:
            raise ValueError(
                "`eps` must have shape (nodes, dim) with at least one node, got "
                f"shape {eps.shape}."
            )
        k = eps.shape[0]
        if t.shape != (k,) or w.shape != (k,):
            raise ValueError(
                f"`t` and `w` must have shape ({k},), one per node, got "
                f"{t.shape} and {w.shape}."
            )
        for name, a in (("t", t), ("eps", eps), ("w", w)):
            if not jnp.issubdtype(a.dtype, jnp.floating):
                raise TypeError(f"`{name}` must be floating, got {a.dtype}.")
        self.t = check_value(
            t,
            lambda xp, v: ~((v > 0) & (v <= 1)),
            "the node times `t` must lie in (0, 1].",
        )
        self.eps = check_value(
            eps, lambda xp, v: ~xp.isfinite(v), "the noise draws `eps` must be finite."
        )
        self.w = check_value(
            w,
            lambda xp, v: ~(v >= 0) | ~xp.isfinite(v),
            "the node weights `w` must be finite and nonnegative.",
        )

    @property
    def size(self) -> int:
        """The number of nodes $K$."""
        return self.eps.shape[0]

    @property
    def dim(self) -> int:
        """The dimension $n$ of the joint space the nodes belong to."""
        return self.eps.shape[1]


def _levels_array(levels, dtype):
    if levels is None:
        return jnp.linspace(0.002, 0.05, 8, dtype=dtype)
    levels = jnp.asarray(levels)
    if levels.ndim != 1 or levels.shape[0] == 0:
        raise ValueError(
            f"`levels` must be a non-empty vector of times, got shape {levels.shape}."
        )
    return levels.astype(dtype)


def field_nodes(
    key: PRNGKeyArray,
    n: int,
    levels: Float[ArrayLike, " levels"] | Sequence[float] | None = None,
    samples: int = 4,
    antithetic: bool = True,
    dtype: DTypeLike | None = None,
) -> FieldNodes:
    r"""Draw field nodes: `samples` noise draws at each of several noise levels.

    With `antithetic=True` every draw $e$ comes with $-e$, which cancels the
    odd part of the Monte Carlo error (and makes the field exact for a
    locally linear $\hat\epsilon$). All $K$ nodes get the weight $1/K$.

    **Arguments:**

    - `key`: a PRNG key.
    - `n`: the dimension of the joint space.
    - `levels`: the diffusion times; `linspace(0.002, 0.05, 8)` by default
      (small times: the field should read the data distribution, not its
      heavily smoothed version).
    - `samples`: draws per level.
    - `antithetic`: whether to add the negated draws.
    - `dtype`: a floating dtype; JAX's default float by default.

    **Returns:**

    A [`retrax.relations.FieldNodes`][] with
    $K = $ `len(levels) * samples * (2 if antithetic else 1)` nodes.
    """
    check_positive_int("n", n)
    check_positive_int("samples", samples)
    dtype = jnp.result_type(float) if dtype is None else dtype
    levels = _levels_array(levels, dtype)
    t, eps, w = _draw_nodes(key, levels, n, samples, bool(antithetic), dtype)
    return FieldNodes(t, eps, w)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _draw_nodes(key, levels, n, samples, antithetic, dtype):
    # One program: drawn eagerly op by op, the nodes compiled seven small ones
    # beside the draw's own. (The default levels are made outside it: inside,
    # XLA may fuse `linspace` into its users and round a level differently.)
    m = levels.shape[0]
    eps = jax.random.normal(key, (m, samples, n), dtype=dtype)
    if antithetic:
        eps = jnp.concatenate([eps, -eps], axis=1)
    per = eps.shape[1]
    t = jnp.repeat(levels, per)
    eps = eps.reshape(m * per, n)
    k = eps.shape[0]
    w = jnp.full((k,), 1.0 / k, dtype=dtype)
    return t, eps, w


def noisefree_nodes(
    n: int, t: float = 0.002, dtype: DTypeLike | None = None
) -> FieldNodes:
    r"""One node at time `t`, zero noise: $g(z) \propto \hat\epsilon(\alpha_t z, t)$.

    Cheap (one network call) but reads the model at one noise level only.

    **Arguments:**

    - `n`: the dimension of the joint space.
    - `t`: the diffusion time in `(0, 1]`.
    - `dtype`: a floating dtype; JAX's default float by default.

    **Returns:**

    A [`retrax.relations.FieldNodes`][] with one node of weight 1.
    """
    check_positive_int("n", n)
    dtype = jnp.result_type(float) if dtype is None else dtype
    return FieldNodes(
        jnp.full((1,), t, dtype=dtype),
        jnp.zeros((1, n), dtype=dtype),
        jnp.ones((1,), dtype=dtype),
    )


def density_lambda(
    schedule: AbstractNoiseSchedule, nodes: FieldNodes
) -> Float[Array, ""]:
    r"""The field weight that makes the implicit field a data-unit score.

    Averaged over the noise, $\hat\epsilon(\alpha_k z + \sigma_k e, t_k)
    \approx -\sigma_k\nabla_x\log p_{t_k} = -(\sigma_k/\alpha_k)\nabla_z\log
    \tilde p_k(z)$, so the field $\sum_k w_k\lambda_k(\hat\epsilon_k - e_k)$
    with $\lambda_k = \lambda\sigma_k/\alpha_k$ is about
    $\lambda\sum_k w_k\sigma_k^2/\alpha_k^2\,(-\nabla\log\tilde p(z))$.
    Choosing $\lambda = 1/\sum_k w_k\sigma_k^2/\alpha_k^2$ makes it
    approximate $-\nabla\log p(z)$ in the data's own units, so its Jacobian
    is a precision (used by [`retrax.relations.implicit_laplace`][]).

    **Arguments:**

    - `schedule`: the noise schedule of the predictor.
    - `nodes`: the field nodes.

    **Returns:**

    The scalar $\lambda$.
    """
    t = nodes.t  # checked when the nodes were built: no check staged here
    ratio = schedule._sigma(t) ** 2 / schedule._alpha(t) ** 2
    return 1.0 / jnp.sum(nodes.w * ratio.astype(nodes.w.dtype))


def _time_of_noise(schedule, ratio, dtype):
    """The times where $\\sigma_t/\alpha_t$ equals `ratio`, by bisection on
    `[t_min, 1]` (the ratio increases with $t$ for any schedule)."""
    lo = jnp.full(ratio.shape, schedule.t_min, dtype)
    lo = jnp.maximum(lo, jnp.finfo(dtype).tiny)
    hi = jnp.ones(ratio.shape, dtype)

    def body(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        above = schedule._sigma(mid) / schedule._alpha(mid) > ratio
        return jnp.where(above, lo, mid), jnp.where(above, mid, hi)

    lo, hi = jax.lax.fori_loop(0, 60, body, (lo, hi))
    return 0.5 * (lo + hi)


def data_levels(
    schedule: AbstractNoiseSchedule,
    data: Float[ArrayLike, "points n"],
    n_levels: int = 8,
    low: float = 0.25,
    high: float = 2.0,
) -> Float[Array, " levels"]:
    r"""Field-node levels scaled to the data's own spacing.

    The default levels of [`retrax.relations.field_nodes`][] read the data at
    noise standard deviations $\sigma_t/lpha_t$ from about 0.016 to 0.17
    (for the default `VPSDE`): right for data spread over unit scales with
    points about 0.1 apart, too smooth for finer data (the answers of a query
    then land off the data by the smoothing bias) and too sharp for coarser
    data. This returns `n_levels` times whose noise standard deviations run
    geometrically from `low * h` to `high * h`, where $h$ is the median
    distance from a data point to its nearest neighbour. Pass them as
    `field_nodes(key, n, levels=data_levels(schedule, data))`.

    The distance matrix is formed in full: `data` of a few thousand points
    at most (a subsample is enough to measure the spacing).

    **Arguments:**

    - `schedule`: the predictor's noise schedule.
    - `data`: the training data, shape `(points, n)`, at least two points.
    - `n_levels`: the number of levels.
    - `low`, `high`: the smallest and largest noise standard deviation, in
      units of the nearest-neighbour spacing $h$ ($0 <$ `low` $\le$ `high`).

    **Returns:**

    The levels, shape `(n_levels,)`, increasing, in `[t_min, 1]`; a level
    whose noise would exceed the schedule's range is 1, one below it `t_min`.
    """
    check_positive_int("n_levels", n_levels)
    data = jnp.asarray(data)
    if data.ndim != 2 or data.shape[0] < 2:
        raise ValueError(
            "`data` must be points of shape (points, n) with at least two points, "
            f"got shape {data.shape}."
        )
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(f"`data` must be floating, got {data.dtype}.")
    if not 0 < low <= high:
        raise ValueError(f"need 0 < `low` <= `high`, got low={low}, high={high}.")
    dtype = data.dtype
    data = error_if(
        data, ~jnp.all(jnp.isfinite(data)), "`data` must be finite (no inf or NaN)."
    )
    sq = jnp.sum((data[:, None, :] - data[None, :, :]) ** 2, axis=-1)
    sq = jnp.where(jnp.eye(data.shape[0], dtype=bool), jnp.inf, sq)
    spacing = jnp.median(jnp.sqrt(jnp.min(sq, axis=1)))
    spacing = error_if(
        spacing,
        ~(spacing > 0),
        "`data` has a median nearest-neighbour distance of 0 (repeated points): "
        "remove duplicates before measuring its spacing.",
    )
    factors = jnp.geomspace(low, high, n_levels).astype(dtype)
    return _time_of_noise(schedule, factors * spacing, dtype)


def _thickness(data, neighbours, points):
    """The median, over `points` rows of `data`, of the standard deviation of
    the thinnest direction of their `neighbours` nearest neighbours."""
    rows = jnp.linspace(0, data.shape[0] - 1, points).round().astype(jnp.int32)

    def local(x):
        sq = jnp.sum((data - x) ** 2, axis=-1)
        _, idx = jax.lax.top_k(-sq, neighbours)
        nb = data[idx]
        nb = nb - jnp.mean(nb, axis=0)
        cov = nb.T @ nb / (neighbours - 1)
        return jnp.sqrt(jnp.maximum(jnp.linalg.eigvalsh(cov)[0], 0))

    return jnp.median(jax.lax.map(local, data[rows]))


def belief_levels(
    schedule: AbstractNoiseSchedule,
    data: Float[ArrayLike, "points n"],
    n_levels: int = 4,
    low: float = 0.25,
    high: float = 1.0,
    *,
    neighbours: int = 128,
    points: int = 512,
) -> Float[Array, " levels"]:
    r"""Field-node levels that read the data's own thickness: for calibrated
    Laplace beliefs.

    Near a thin relation (data on a manifold, spread $s$ across it) the field
    at noise standard deviation $r = \sigma_t/\alpha_t$ sees the data
    smoothed to a thickness $\sqrt{s^2 + r^2}$, and the Laplace covariance of
    [`retrax.relations.implicit_laplace`][] has, across the relation, the
    variance $\sum_k w_k r_k^2 / \sum_k w_k r_k^2/(s^2 + r_k^2)$: about the
    mean $r_k^2$ when the levels' noise exceeds the data's thickness. Levels
    much noisier than $s$ (the defaults of
    [`retrax.relations.field_nodes`][] on finely measured data) thus give
    beliefs far too wide; levels with $r \lesssim s$ give a belief about as
    sharp as the data: the variance across the relation is a weighted mean
    of the $s^2 + r_k^2$, at most $s^2 + \max_k r_k^2$. The price is
    smoothness: the smallest levels read the model where its error is
    largest, so the answers scatter more about the data (see the relations
    theory page for the trade-off, measured).

    This measures $s$ as the median, over `points` rows of `data`, of the
    standard deviation of the thinnest principal direction of their
    `neighbours` nearest neighbours (local PCA; neighbourhoods not much wider
    than the thickness truncate it, so with too few points or neighbours
    the estimate is low, which only sharpens the beliefs), and returns
    `n_levels` times whose noise standard deviations run geometrically from
    `low * s` to `high * s`, none below the schedule's `t_min` (the model
    was not trained there: such levels are `t_min`, so for data thinner than
    the noise at `t_min` all levels coincide, which only adds noise draws
    there). Pass them as `field_nodes(key, n, levels=belief_levels(schedule,
    data))`; the covariance scale $\lambda_{\mathrm{eff}}$ of the Laplace
    belief holds for any `lam`. For data thinner than the noise at `t_min`,
    build the relation with `ImplicitDiffusion(..., deblur=True)` too, which
    removes the levels' own smoothing from its beliefs.

    Unlike [`retrax.relations.data_levels`][] (the spacing between points,
    for where answers land), this reads the spread across the relation
    (for how wide the beliefs are).

    **Arguments:**

    - `schedule`: the predictor's noise schedule.
    - `data`: the training data (or a subsample of it), shape `(points, n)`,
      more than `neighbours` points.
    - `n_levels`: the number of levels.
    - `low`, `high`: the smallest and largest noise standard deviation, in
      units of the thickness $s$ ($0 <$ `low` $\le$ `high`).
    - `neighbours`: the neighbourhood size of the local PCA, more than the
      dimension of the joint space.
    - `points`: how many rows of `data` (evenly spaced) the median runs over.

    **Returns:**

    The levels, shape `(n_levels,)`, nondecreasing, in `[t_min, 1]`.
    """
    check_positive_int("n_levels", n_levels)
    check_positive_int("neighbours", neighbours)
    check_positive_int("points", points)
    data = jnp.asarray(data)
    if data.ndim != 2:
        raise ValueError(
            f"`data` must be points of shape (points, n), got shape {data.shape}."
        )
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(f"`data` must be floating, got {data.dtype}.")
    if neighbours <= data.shape[1]:
        raise ValueError(
            f"`neighbours` must exceed the dimension {data.shape[1]} of the data "
            f"(a local PCA needs more points than directions), got {neighbours}."
        )
    if data.shape[0] <= neighbours:
        raise ValueError(
            f"`data` must have more than `neighbours`={neighbours} points, got "
            f"{data.shape[0]}."
        )
    if not 0 < low <= high:
        raise ValueError(f"need 0 < `low` <= `high`, got low={low}, high={high}.")
    dtype = data.dtype
    data = error_if(
        data, ~jnp.all(jnp.isfinite(data)), "`data` must be finite (no inf or NaN)."
    )
    thickness = _thickness(data, neighbours, min(points, data.shape[0]))
    thickness = error_if(
        thickness,
        ~(thickness > 0),
        "`data` has no spread across its thinnest direction (repeated points, "
        "or data on an exact subspace): its thickness is 0.",
    )
    noise = jnp.geomspace(low, high, n_levels).astype(dtype) * thickness
    t_min = jnp.asarray(schedule.t_min, dtype)
    floor = schedule._sigma(t_min) / schedule._alpha(t_min)
    return jnp.where(noise <= floor, t_min, _time_of_noise(schedule, noise, dtype))
