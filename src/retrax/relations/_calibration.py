r"""Calibrated off-data tests: whether a query's clamped values lie among the
data a relation was trained on.

A query's `clamp_load` (the field the hard clamps hold against, in noise
standard deviations) cannot tell a clamp just past the edge of the data from
one on the edge: the field reads the data smoothed at the field nodes' noise
levels, and a point a fraction of those levels past an edge pulls on the
clamps about as hard as an edge point of the data itself (on a two-link arm
with the default nodes, an end effector 0.03 out of reach has a load of 0.5,
points on the inner edge of the workspace up to 0.9). The calibrated test
therefore asks the data directly: the distance from the clamped values to
the nearest of a set of training rows, over the clamped coordinates, against
the same distance of the rows among themselves.

With the rows $d_j$ standardised per coordinate by the data's standard
deviations $s$, and $C$ the calibrated clamp coordinates, a query with hard
clamps $P \subseteq C$ at values $z_P$ has

$$D(z) = \min_j \lVert (z_P/s_P) - d_{j,P}\rVert_2,$$

and is off the data when $D(z) > \tau$, where $\tau$ is the `quantile` of
the leave-one-out distances $\min_{j \ne i}\lVert d_{i,C} - d_{j,C}\rVert$
of the rows: a fresh row of the data is then flagged with probability about
`1 - quantile`. For $P \subset C$ the distance over fewer coordinates is no
larger, so a fresh row is flagged no more often. The test reads the data
only, not the field: its resolution is the spacing of the stored rows
(about $m^{-1/|C|}$ of the data's spread for $m$ rows), not the nodes' noise
levels.
"""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float, Int, PRNGKeyArray

from .._errors import error_if
from ._abstract_relation import AbstractImplicitRelation
from ._field import ImplicitDiffusion
from ._support import DataSupport


def _check_clamp(clamp, n: int) -> np.ndarray:
    idx = np.asarray(clamp)
    if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(
            "`clamp` must be a non-empty sequence of coordinate indices (the "
            f"coordinates the queries clamp), got {clamp!r}."
        )
    if idx.min() < 0 or idx.max() >= n:
        raise ValueError(
            f"`clamp` {idx.tolist()} holds a coordinate outside the relation's "
            f"joint space of dimension {n}: every index must lie in [0, {n})."
        )
    if len(set(idx.tolist())) != idx.size:
        raise ValueError(f"`clamp` {idx.tolist()} repeats a coordinate.")
    mask = np.zeros(n, bool)
    mask[idx] = True
    return mask


def _leave_one_out(points, mask, chunk: int = 128):
    """Each row's distance to its nearest other row, over the masked coordinates."""
    m = points.shape[0]
    sub = jnp.where(mask, points, 0)
    pad = (-m) % chunk
    rows = jnp.pad(jnp.arange(m), (0, pad)).reshape(-1, chunk)

    def block(idx):
        # |a - b|^2 by differences, not by |a|^2 - 2ab + |b|^2: the nearest
        # distances are small against the norms, and the expansion cancels.
        diff = sub[idx][:, None, :] - sub[None, :, :]
        d2 = jnp.sum(diff * diff, axis=-1)
        d2 = jnp.where(idx[:, None] == jnp.arange(m)[None, :], jnp.inf, d2)
        return jnp.min(d2, axis=1)

    d2 = jax.lax.map(block, rows).reshape(-1)[:m]
    return jnp.sqrt(d2)


def calibrate_off_data(
    relation: AbstractImplicitRelation,
    data: Float[ArrayLike, "rows n"],
    clamp: Sequence[int] | Int[ArrayLike, " k"],
    *,
    quantile: float = 0.999,
    key: PRNGKeyArray | None = None,
    max_points: int = 8192,
) -> AbstractImplicitRelation:
    r"""Calibrate a relation's off-data test on its training data.

    Stores up to `max_points` rows of `data` with the relation (a
    [`retrax.relations.DataSupport`][]), and the distance $\tau$ that the
    `quantile` of the rows' leave-one-out nearest-neighbour distances over
    the `clamp` coordinates is (in units of the data's standard deviation
    per coordinate). A query of the returned relation whose hard clamps
    are among the `clamp` coordinates is then `off_data` when its clamped
    values lie farther than $\tau$ from every stored row, over its clamped
    coordinates: a fresh row of the data clamped so is flagged with
    probability about `1 - quantile`, and a value past the data's edge by
    more than about the spacing of the stored rows is flagged. The test
    reads the data rather than the field: the clamp load sees the data
    smoothed at the field nodes' noise levels, and cannot tell a clamp just
    past the data's edge from one on it (see "Answers off the data" in the
    theory of relations).

    What each query gets, with the default `off_data_tol=None` of
    [`retrax.relations.implicit_infer`][],
    [`retrax.relations.implicit_roots`][] and
    [`retrax.relations.factor_infer`][]:

    - hard clamps among the calibrated coordinates (all of them or some):
      `off_data = support_ratio > 1`, with
      `support_ratio` $= D(z_0)/\tau$ reported in the solution;
    - other clamps (a coordinate that was not calibrated, or none): the
      uncalibrated rule `off_data = clamp_load > 3`, and `support_ratio` is
      NaN.

    An explicit `off_data_tol=float` always uses `clamp_load > off_data_tol`.
    Relations that hold the returned one ([`retrax.relations.Factor`][],
    [`retrax.relations.IndexedRelation`][] on its coordinates,
    [`retrax.relations.ProductRelation`][], whose ratio is the largest of
    its calibrated members') carry its test. A relation trained further
    (for instance by [`retrax.relations.fit_through_inference`][]) keeps its
    calibration; calibrate again if the data changed.

    The stored rows are arrays of the relation, so
    [`retrax.save_checkpoint`][] saves them; to read them back, give
    [`retrax.load_checkpoint`][] a `like` of the calibrated shape, e.g.
    `eqx.filter_eval_shape(calibrate_off_data, relation, data, clamp)`.

    **Arguments:**

    - `relation`: an [`retrax.relations.ImplicitDiffusion`][] (the relation
      that holds a learned model; calibrate it before wrapping it in a
      factor or a product).
    - `data`: the training data (or a sample of it), shape `(rows, n)` with
      `rows >= 2` and `n` the relation's dimension; finite.
    - `clamp`: the coordinates the queries will clamp, distinct indices in
      `[0, n)`.
    - `quantile`: in `(0, 1)`: the share of fresh data rows that should pass
      as on the data.
    - `key`: a PRNG key to draw `max_points` rows at random when `data` has
      more; `None` takes evenly spaced rows.
    - `max_points`: the most rows stored. More rows resolve the data's edge
      more finely (the stored rows' spacing) at a cost of `max_points * n`
      numbers in memory and per query.

    **Returns:**

    The relation with its [`retrax.relations.DataSupport`][] set (`support`).
    """
    if not isinstance(relation, ImplicitDiffusion):
        raise TypeError(
            "`relation` must be an ImplicitDiffusion (the relation that holds the "
            f"learned model), got {type(relation).__name__}. Calibrate the "
            "ImplicitDiffusion before wrapping it in a Factor, an "
            "IndexedRelation or a ProductRelation."
        )
    n = relation.dim
    if not isinstance(quantile, int | float) or isinstance(quantile, bool):
        raise TypeError(f"`quantile` must be a float in (0, 1), got {quantile!r}.")
    if not 0 < quantile < 1:
        raise ValueError(f"`quantile` must lie in (0, 1), got {quantile!r}.")
    if isinstance(max_points, bool) or not isinstance(max_points, int | np.integer):
        raise TypeError(f"`max_points` must be an integer >= 2, got {max_points!r}.")
    if max_points < 2:
        raise ValueError(f"`max_points` must be at least 2, got {max_points!r}.")
    mask = _check_clamp(clamp, n)
    data = jnp.asarray(data)
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(f"`data` must be real floating rows, got dtype {data.dtype}.")
    if data.ndim != 2 or data.shape[1] != n or data.shape[0] < 2:
        raise ValueError(
            f"`data` must have shape (rows, {n}) with rows >= 2 (one training row "
            f"per line, as long as the relation's joint dimension), got shape "
            f"{data.shape}."
        )
    data = error_if(
        data,
        jnp.any(~jnp.isfinite(data)),
        "`data` must be finite (it holds inf or NaN).",
    )
    rows = data.shape[0]
    if rows > max_points:
        if key is None:
            pick = np.linspace(0, rows - 1, max_points).round().astype(int)
        else:
            pick = jax.random.choice(key, rows, (max_points,), replace=False)
        chosen = data[pick]
    else:
        chosen = data
    std = jnp.std(data, axis=0)
    scale = jnp.where(std > 0, std, jnp.ones((), data.dtype))
    points = chosen / scale
    dist = _leave_one_out(points, jnp.asarray(mask))
    tol = jnp.quantile(dist, quantile)
    tol = error_if(
        tol,
        ~(tol > 0),
        "the calibrated distance is 0: more than `1 - quantile` of the rows of "
        "`data` repeat another row on the `clamp` coordinates. Remove the "
        "duplicates or lower `quantile`.",
    )
    support = DataSupport(
        points=points,
        scale=scale,
        clamp=jnp.asarray(mask),
        tol=tol,
        quantile=float(quantile),
    )
    return eqx.tree_at(
        lambda r: r.support, relation, support, is_leaf=lambda x: x is None
    )
