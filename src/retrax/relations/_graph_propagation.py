r"""Loopy Gaussian belief propagation on a factor graph.

Every iteration takes each factor row's quadratic model at the variables'
current belief means (its local precision $\Lambda$ and information
$\Lambda\bar x - \nabla E_i(\bar x)$: exact for a Gaussian row, Gauss–Newton
for a residual, the positive part of the symmetric Jacobian for a learned
relation), and passes Gaussian messages in canonical form: a row's message
to a slot is its model times the messages from its other slots,
marginalised onto the slot (a Schur complement). A fixed point's means are a
root of the graph's gradient (each model's gradient at the means is the
row's), so on a tree they are the joint solve's answer, and on a loopy
linear-Gaussian graph the exact posterior means when it converges.
"""

from collections.abc import Mapping
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._deprecated import deprecated_property
from .._errors import error_if, filter_jit
from .._never_silent import nan_unless
from .._solution import AbstractSolution, throw_if_failed
from .._validate import check_positive_int, check_tol, static_float
from ._graph import FactorGraph
from ._infer import default_tol
from ._solution import RESULTS


class PropagationSolution(AbstractSolution):
    r"""The beliefs of [`retrax.relations.propagate_beliefs`][].

    **Attributes:**

    - `value`: the answer, each variable's belief mean, by name (a variable
      `(dimension,)`, a family `(count, dimension)`). `values` is its old
      name, deprecated (with a `DeprecationWarning`).
    - `covariances`: each variable's belief covariance, by name
      (`(dimension, dimension)`, or `(count, dimension, dimension)`).
    - `x`: the means as one flat vector.
    - `result`: [`retrax.relations.RESULTS`][]: `successful`;
      `max_steps_reached` (finite, not converged); `diverged` (a message or
      a belief became non-finite, a belief lost the precision it had, or a
      factor stopped being finite at the means the run reached);
      `nonfinite_factor` (a factor is not finite at `init`: a NaN or
      infinite value in it).
    - `stats`: `{"num_steps": ..., "change": {name: ...}, "factor": ...}`:
      the iterations taken; per variable, the largest change of its mean in
      the last iteration (`()` for a variable, `(count,)` for a family; inf
      where its belief is not proper yet); and the index in `graph.factors`
      of the first factor found not finite (-1 if none).

    NaN unless `result` is `successful`.
    """

    value: dict[str, Array]
    covariances: dict[str, Array]
    x: Float[Array, " n"]
    result: RESULTS
    stats: dict

    values = deprecated_property(
        "PropagationSolution.values", ".value", lambda s: s.value
    )


def _pad(a: Array, d: int) -> Array:
    """A `(..., k)` or `(..., k, k)` block padded with zeros to `d`."""
    extra = d - a.shape[-1]
    widths = [(0, 0)] + [(0, extra)] * (a.ndim - 1)
    return jnp.pad(a, widths)


def _row_messages(prec, info, inc_info, inc_prec, sizes):
    """One row's messages to each of its slots (canonical form), from its
    model `(prec, info)` and the messages its slots send it."""
    starts = np.concatenate([[0], np.cumsum(sizes)])
    big_p = prec + jax.scipy.linalg.block_diag(*inc_prec)
    big_i = info + jnp.concatenate(inc_info)
    out_i, out_p = [], []
    for t in range(len(sizes)):
        sl = np.arange(starts[t], starts[t + 1])
        if len(sizes) == 1:
            out_i.append(info)
            out_p.append(prec)
            continue
        other = np.setdiff1d(np.arange(starts[-1]), sl)
        # the row's model times the other slots' messages (not this slot's)
        a_tt = prec[np.ix_(sl, sl)]
        b_t = info[sl]
        a_to = big_p[np.ix_(sl, other)]
        a_oo = big_p[np.ix_(other, other)]
        b_o = big_i[other]
        w = a_to @ jnp.linalg.pinv(a_oo, hermitian=True)
        out_p.append(_psd_part(a_tt - w @ a_to.T))
        out_i.append(b_t - w @ b_o)
    return tuple(out_i), tuple(out_p)


def _psd_part(a: Array) -> Array:
    """The positive semidefinite part of a symmetric matrix.

    A message's precision is a Schur complement of a positive semidefinite
    matrix (a row's model plus its other slots' messages), so it is positive
    semidefinite; computed, it loses that by rounding (a chain's first
    messages are `a - a` to the last bit), and a negative eigenvalue passed
    round a loop grows without bound."""
    vals, vecs = jnp.linalg.eigh(0.5 * (a + a.T))
    return (vecs * jnp.maximum(vals, 0)) @ vecs.T


def _models(graph: FactorGraph, x: Array):
    """Per factor, the rows' quadratic models `(precision, information)` at
    the flat point `x`."""
    out = []
    for k, f in enumerate(graph.factors):
        xs = graph._gather(k, x)
        prec = jax.vmap(f.row_precision)(f.rows(), xs).astype(x.dtype)
        grad = jax.vmap(f.row_gradient)(f.rows(), xs).astype(x.dtype)
        point = jnp.concatenate(xs, axis=1)
        out.append((prec, jnp.einsum("mij,mj->mi", prec, point) - grad))
    return out


# A belief whose precision's smallest eigenvalue is within this many units of
# rounding of its rows' precisions carries no information yet (a message that
# is `a - a` to the last bit), and its mean is not solved for.
_ROUNDING = 64


class _Structure(NamedTuple):
    """The static index arrays belief propagation needs."""

    sizes: tuple[tuple[int, ...], ...]  # per factor, per slot
    gids: tuple[tuple[tuple[int, ...], ...], ...]  # per factor, per slot, per row
    num_vars: int
    dmax: int


def _structure(graph: FactorGraph) -> _Structure:
    lay = graph.layout
    dims = {name: dim for name, _, dim, _ in graph.variables}
    sizes = tuple(tuple(dims[fam] for fam, _ in f.slots) for f in graph.factors)
    gids = tuple(
        tuple(tuple(int(v) for v in ids[:, s]) for s in range(ids.shape[1]))
        for ids in lay.row_vars
    )
    return _Structure(sizes, gids, len(lay.var_dim), int(lay.var_dim.max()))


def _beliefs(st: _Structure, msgs, dtype):
    info = jnp.zeros((st.num_vars, st.dmax), dtype)
    prec = jnp.zeros((st.num_vars, st.dmax, st.dmax), dtype)
    for k, (mi, mp) in enumerate(msgs):
        for s in range(len(st.sizes[k])):
            gid = np.asarray(st.gids[k][s])
            info = info.at[gid].add(_pad(mi[s], st.dmax))
            prec = prec.at[gid].add(_pad(mp[s], st.dmax))
    return info, prec


def _scales(st: _Structure, models, dtype):
    """Per variable, the largest entry of its rows' own precision blocks: the
    scale of the rounding in its belief (a message's precision is such a
    block minus a Schur complement of the same size)."""
    scale = jnp.zeros((st.num_vars,), dtype)
    for k, (prec, _) in enumerate(models):
        start = 0
        for s, d in enumerate(st.sizes[k]):
            block = prec[:, start : start + d, start : start + d]
            gid = np.asarray(st.gids[k][s])
            scale = scale.at[gid].max(jnp.max(jnp.abs(block), axis=(-1, -2)))
            start += d
    return scale


def _means(graph, st, info, prec, old, scale):
    r"""Belief means `prec^{-1} info` (the padding's identity added), the old
    mean where a belief is not yet proper: its smallest eigenvalue not above
    the rounding of its rows' precisions (`scale`), as a variable the
    messages have not reached yet. Also whether each belief is clearly
    proper (its smallest eigenvalue above $\sqrt{\epsilon}$ `scale`)."""
    lay = graph.layout
    dims = np.asarray(lay.var_dim)
    pad = (np.arange(st.dmax)[None, :] >= dims[:, None]).astype(np.float64)
    padded = prec + jnp.asarray(pad, prec.dtype)[:, :, None] * jnp.eye(
        st.dmax, dtype=prec.dtype
    )
    # one eigendecomposition a belief gives both its properness and its mean
    # (no second factorisation; an improper belief keeps the old mean)
    vals, vecs = jnp.linalg.eigh(0.5 * (padded + jnp.swapaxes(padded, -1, -2)))
    eps = jnp.finfo(prec.dtype).eps
    proper = vals[:, 0] > _ROUNDING * eps * scale
    safe = jnp.where(proper[:, None], vals, jnp.ones_like(vals))
    coords = jnp.einsum("vij,vi->vj", vecs, info) / safe
    mean = jnp.einsum("vij,vj->vi", vecs, coords)
    ok = proper & jnp.all(jnp.isfinite(mean), axis=-1)
    return (
        jnp.where(ok[:, None], mean, old),
        padded,
        proper,
        vals[:, 0] > jnp.sqrt(eps) * scale,
    )


def _flat(graph, st, means):
    lay = graph.layout
    coords = np.concatenate(
        [lay.var_start[v] + np.arange(d) for v, d in enumerate(lay.var_dim)]
    )
    cols = np.concatenate([np.arange(d) for d in lay.var_dim])
    rows = np.concatenate([np.full(d, v) for v, d in enumerate(lay.var_dim)])
    return jnp.zeros(lay.n, means.dtype).at[coords].set(means[rows, cols])


def _unflat_means(graph, st, x):
    lay = graph.layout
    out = jnp.zeros((st.num_vars, st.dmax), x.dtype)
    cols = np.concatenate([np.arange(d) for d in lay.var_dim])
    rows = np.concatenate([np.full(d, v) for v, d in enumerate(lay.var_dim)])
    return out.at[rows, cols].set(x)


def _incoming(st, k, s, info, prec, mi, mp):
    """The messages slot `s` of factor `k`'s rows receive: the variable's
    belief with the row's own message divided out."""
    gid = np.asarray(st.gids[k][s])
    d = st.sizes[k][s]
    return info[gid, :d] - mi[s], prec[gid, :d, :d] - mp[s]


def _flood(st, models, msgs, info, prec, damping):
    new = []
    for k, (mi, mp) in enumerate(msgs):
        inc = [_incoming(st, k, s, info, prec, mi, mp) for s in range(len(mi))]
        inc_i = tuple(i for i, _ in inc)
        inc_p = tuple(p for _, p in inc)
        out_i, out_p = jax.vmap(
            lambda p, i, ii, ip, sizes=st.sizes[k]: _row_messages(p, i, ii, ip, sizes)
        )(models[k][0], models[k][1], inc_i, inc_p)
        out_i = tuple(
            (1 - damping) * a + damping * b for a, b in zip(out_i, mi, strict=True)
        )
        out_p = tuple(
            (1 - damping) * a + damping * b for a, b in zip(out_p, mp, strict=True)
        )
        new.append((out_i, out_p))
    return new


def _sweep(st, models, msgs, info, prec, damping, reverse):
    """Rows one at a time, each using the beliefs its predecessors updated."""
    msgs = list(msgs)
    order = range(len(msgs))
    for k in reversed(order) if reverse else order:
        mi, mp = msgs[k]
        sizes = st.sizes[k]
        gids = jnp.asarray(np.stack([np.asarray(g) for g in st.gids[k]], axis=1))
        m = gids.shape[0]

        def body(j, carry, k=k, sizes=sizes, gids=gids, m=m):
            mi, mp, info, prec = carry
            r = m - 1 - j if reverse else j
            inc_i, inc_p = [], []
            for s, d in enumerate(sizes):
                g = gids[r, s]
                inc_i.append(info[g, :d] - mi[s][r])
                inc_p.append(prec[g, :d, :d] - mp[s][r])
            out_i, out_p = _row_messages(
                models[k][0][r], models[k][1][r], tuple(inc_i), tuple(inc_p), sizes
            )
            mi, mp = list(mi), list(mp)
            for s, d in enumerate(sizes):
                g = gids[r, s]
                new_i = (1 - damping) * out_i[s] + damping * mi[s][r]
                new_p = (1 - damping) * out_p[s] + damping * mp[s][r]
                info = info.at[g, :d].add(new_i - mi[s][r])
                prec = prec.at[g, :d, :d].add(new_p - mp[s][r])
                mi[s] = mi[s].at[r].set(new_i)
                mp[s] = mp[s].at[r].set(new_p)
            return tuple(mi), tuple(mp), info, prec

        mi, mp, info, prec = jax.lax.fori_loop(0, m, body, (mi, mp, info, prec))
        msgs[k] = (mi, mp)
    return msgs, info, prec


class _Carry(NamedTuple):
    """The loop's state."""

    msgs: list  # per factor, (information, precision) per slot
    means: Array  # (num_vars, dmax)
    step: Array  # ()
    change: Array  # (num_vars,): inf where a belief is not proper yet
    informed: Array  # (num_vars,): whether each belief is clearly proper
    bad_factor: Array  # (): the first factor whose model was not finite, or -1
    diverged: Array  # (): a message or belief became non-finite, or lost its precision


def _finite_models(models) -> Array:
    """Per factor, whether every row's model is finite."""
    return jnp.stack(
        [jnp.all(jnp.isfinite(p)) & jnp.all(jnp.isfinite(i)) for p, i in models]
    )


def _iteration(graph, st, schedule, damping, carry: _Carry) -> _Carry:
    """One iteration: linearise at the means, pass the schedule's messages,
    solve the beliefs for the new means."""
    dtype = carry.means.dtype
    models = _models(graph, _flat(graph, st, carry.means))
    finite = _finite_models(models)
    msgs = carry.msgs
    info, prec = _beliefs(st, msgs, dtype)
    if schedule == "flooding":
        msgs = _flood(st, models, msgs, info, prec, damping)
        info, prec = _beliefs(st, msgs, dtype)
    else:
        msgs, info, prec = _sweep(st, models, msgs, info, prec, damping, False)
        msgs, info, prec = _sweep(st, models, msgs, info, prec, damping, True)
    new, _, proper, informed = _means(
        graph, st, info, prec, carry.means, _scales(st, models, dtype)
    )
    change = jnp.where(proper, jnp.max(jnp.abs(new - carry.means), axis=-1), jnp.inf)
    nonfinite = ~(jnp.all(jnp.isfinite(info)) & jnp.all(jnp.isfinite(prec)))
    # a belief that held information and lost it: its means were driven where
    # its rows' linearisations carry none (an iterate running off to infinity)
    nonfinite = nonfinite | jnp.any(carry.informed & ~proper)
    bad_factor = jnp.where(jnp.all(finite), -1, jnp.argmin(finite)).astype(jnp.int32)
    # A factor not finite at the first point is the graph's fault (its values,
    # or a residual undefined at `init`); one that stops being finite at means
    # the iteration reached later has been driven off by it: divergence. The
    # last finite state is kept either way.
    keep = jnp.all(finite)
    return _Carry(
        msgs=jax.tree.map(lambda a, b: jnp.where(keep, a, b), msgs, carry.msgs),
        means=jnp.where(keep, new, carry.means),
        step=carry.step + 1,
        change=change,
        informed=jnp.where(keep, informed, carry.informed),
        bad_factor=bad_factor,
        diverged=(keep & nonfinite) | (~keep & (carry.step > 0)),
    )


def _factor_messages(graph: FactorGraph) -> list[str]:
    """Per factor, the message naming it when its model is not finite."""
    return [
        f"factor {k} of the graph ({type(f).__name__} over "
        f"{[name for name, _ in f.slots]}) is not finite at the belief means: "
        "a NaN or infinite coefficient, target or precision, or a residual or "
        "relation that is not finite there. Check that factor's values."
        for k, f in enumerate(graph.factors)
    ]


def _check_dtype(dtype, x0: Array, init) -> None:
    """Belief propagation's float32 or float64; a `TypeError` naming the
    argument that chose another."""
    if jnp.dtype(x0.dtype) in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        return
    name = "dtype" if dtype is not None else "init"
    raise TypeError(
        f"`{name}` gives the dtype {jnp.dtype(x0.dtype).name}, but belief "
        "propagation runs in float32 or float64 (its eigen- and linear solves have "
        f"no {jnp.dtype(x0.dtype).name} form); pass `dtype=jnp.float32` or "
        "`jnp.float64`."
    )


@filter_jit
def propagate_beliefs(
    graph: FactorGraph,
    init: Mapping[str, Float[ArrayLike, "..."]] | None = None,
    *,
    schedule: Literal["flooding", "sequential"] = "flooding",
    damping: float = 0.0,
    tol: float | None = None,
    max_steps: int = 100,
    dtype=None,
    throw: bool = True,
) -> PropagationSolution:
    r"""Loopy Gaussian belief propagation on a factor graph.

    Each iteration linearises every factor row at the current belief means
    (see the module notes: exact for Gaussian rows), passes the messages of
    the `schedule` and updates the beliefs; it stops when no variable's
    mean moved more than $\mathrm{tol}(1 + \max|\bar x|)$. A converged run's
    means are a root of the graph's gradient: on a tree, the answer of
    [`retrax.relations.solve_graph`][] (and its beliefs the exact marginals
    of a linear-Gaussian graph); on a loopy linear-Gaussian graph, the exact
    posterior means (its variances are then approximations).

    **Arguments:**

    - `graph`: the [`retrax.relations.FactorGraph`][].
    - `init`: the first linearisation point by variable name (others 0).
    - `schedule`: `"flooding"` (every message from the last iteration's,
      all rows of a factor in one `vmap`-ed call) or `"sequential"` (one row
      at a time, each seeing the beliefs the rows before it updated; a
      forward then a backward pass over the factors and rows per iteration,
      exact in one iteration on a linear-Gaussian chain in row order).
    - `damping`: in `[0, 1)`: each new message is `(1 - damping)` times the
      computed one plus `damping` times the last (canonical parameters).
    - `tol`: the tolerance of the means' change; `1e-9` in float64 and
      `1e-5` in float32 by default.
    - `max_steps`: the most iterations.
    - `dtype`: the dtype; `init`'s, or JAX's default float, by default.
    - `throw`: whether a run that does not converge raises (a factor not
      finite at `init` with a message naming it).

    A belief whose precision is within rounding of zero (relative to its
    rows' precisions) carries no information yet, and its mean is not
    solved for: on a chain, the first messages away from a prior are `a - a`
    to the last bit. Message precisions are kept positive semidefinite, as
    they are in exact arithmetic.

    On a graph with loops the means converge, when they do, at a rate set by
    the loops: Gaussian belief propagation passes information one factor per
    iteration (`"flooding"`) or one sweep per iteration (`"sequential"`), and
    a loop of stiff factors (a pose graph's odometry closed by a loop
    closure) keeps much of its error each time round, while every iteration
    relinearises the factors at means that are still far off. On a nonlinear
    Pose2 graph (two laps of a circle, loop closures between the laps, from
    dead reckoning) `schedule="sequential"` with `damping=0` converged to
    [`retrax.relations.solve_graph`][]'s answer in 31 iterations for 24
    poses and 2 closures, 128 for 100 poses and 582 for 40 poses with 4
    closures; the default flooding took 243 for 24 poses and had not
    converged after 1,000 for 40. With 20 closures, 300 and 1,000 poses had
    not converged after 1,000 sequential iterations (largest changes 0.07
    and 0.19), and flooding without damping diverged on 1,000 poses. So the
    defaults are not a pose-graph solver: for a small loopy graph use
    `"sequential"` with `max_steps` in the hundreds, and for a pose graph of
    any size `solve_graph`, which takes a handful of steps. The stopping
    test is on the change of the means, so a slowly converging run stops
    about change/(1 - rate) from the fixed point. A run that has not
    converged says so (`max_steps_reached`), one that diverges says that
    (`diverged`); neither is returned as an answer.

    **Returns:**

    A [`retrax.relations.PropagationSolution`][].
    """
    if not isinstance(graph, FactorGraph):
        raise TypeError(f"`graph` must be a FactorGraph, got {type(graph).__name__}.")
    if schedule not in ("flooding", "sequential"):
        raise ValueError(
            f"`schedule` must be 'flooding' or 'sequential', got {schedule!r}."
        )
    damping = static_float("damping", damping)
    if not 0 <= damping < 1:
        raise ValueError(f"`damping` must lie in [0, 1), got {damping!r}.")
    tol = check_tol(tol)
    check_positive_int("max_steps", max_steps)
    if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"`dtype` must be jnp.float32 or jnp.float64, got {jnp.dtype(dtype).name}."
        )
    x0 = graph.flatten(init, dtype)
    _check_dtype(dtype, x0, init)
    dtype = x0.dtype
    tol = default_tol(dtype) if tol is None else tol
    st = _structure(graph)
    msgs0 = [
        (
            tuple(
                jnp.zeros((len(st.gids[k][s]), d), dtype) for s, d in enumerate(sizes)
            ),
            tuple(
                jnp.zeros((len(st.gids[k][s]), d, d), dtype)
                for s, d in enumerate(sizes)
            ),
        )
        for k, sizes in enumerate(st.sizes)
    ]

    def converged(carry):
        scale = 1 + jnp.max(jnp.abs(carry.means))
        return jnp.max(carry.change) <= tol * scale

    def cond(carry):
        failed = (carry.bad_factor >= 0) | carry.diverged
        return (carry.step < max_steps) & ~converged(carry) & ~failed

    carry = jax.lax.while_loop(
        cond,
        lambda c: _iteration(graph, st, schedule, damping, c),
        _Carry(
            msgs=msgs0,
            means=_unflat_means(graph, st, x0),
            step=jnp.zeros((), jnp.int32),
            change=jnp.full((st.num_vars,), jnp.inf, dtype),
            informed=jnp.zeros((st.num_vars,), bool),
            bad_factor=jnp.array(-1, jnp.int32),
            diverged=jnp.array(False),
        ),
    )
    ok = converged(carry) & (carry.bad_factor < 0) & ~carry.diverged
    info, prec = _beliefs(st, carry.msgs, dtype)
    unit = jnp.zeros(st.num_vars, dtype)
    _, padded, _, _ = _means(graph, st, info, prec, carry.means, unit)
    result = RESULTS.where(
        ok,
        RESULTS.successful,
        RESULTS.where(
            carry.diverged,
            RESULTS.diverged,
            RESULTS.where(
                carry.bad_factor >= 0,
                RESULTS.nonfinite_factor,
                RESULTS.max_steps_reached,
            ),
        ),
    )
    x = nan_unless(ok, _flat(graph, st, carry.means))
    sol = PropagationSolution(
        value=graph.unflatten(x),
        covariances=graph.by_variable(nan_unless(ok, jnp.linalg.inv(padded))),
        x=x,
        result=result,
        stats={
            "num_steps": carry.step,
            "change": graph.by_variable(carry.change),
            "factor": carry.bad_factor,
        },
    )
    if throw:
        for k, message in enumerate(_factor_messages(graph)):
            sol = error_if(sol, (carry.bad_factor == k) & ~carry.diverged, message)
    return throw_if_failed(sol, throw, ~ok)
