r"""Training through inference: a task loss on the answers of queries.

The parameters of a relation are fitted so that the answers of a set of
queries (stable roots found by [`retrax.relations.implicit_infer`][]) score
well under a task loss, optionally plus the denoising loss of its predictor
on data. The gradient of the task loss is the implicit-function-theorem
adjoint at each answer ([`retrax.relations.implicit_pullback`][]), or its
Jacobian-free approximation; the solver's iterations are never
differentiated.
"""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree, Shaped
from tqdm.auto import tqdm

from .._deprecated import deprecated_property
from .._errors import error_if, filter_jit
from .._misc import all_finite
from .._solution import AbstractSolution
from .._validate import check_positive_int, check_t_range, check_tol, static_float
from ..diffusion import AbstractPredictor
from ._abstract_relation import AbstractImplicitRelation, clamp_mask
from ._infer import implicit_infer, implicit_pullback
from ._solution import RESULTS


# one module-level default, so that repeated calls reuse the compiled epoch
_ADAM = optax.adam(1e-3)


def _predictor_of(relation):
    return relation.pred


class TaskGradient(AbstractSolution):
    """The task loss of a set of queries and its gradient.

    Returned by [`retrax.relations.task_gradient`][].

    **Attributes:**

    - `loss`: the mean task loss over the valid queries (NaN when none is,
      with `throw=False`).
    - `value`: the answer, the loss's gradient with respect to the trained
      arrays, a pytree shaped like the relation with `None` at the arrays
      not trained. `grads` is its old name, deprecated (with a
      `DeprecationWarning`).
    - `z`: the answers, shape `(queries, n)`.
    - `valid`: which queries entered the loss: converged, stable, a solvable
      adjoint system (for `gradient="implicit"`) and a finite loss.
    - `failed`: the number of queries masked out.
    - `result`: each query's [`retrax.relations.RESULTS`][] code from
      [`retrax.relations.implicit_infer`][] (a failed query is masked out of
      the loss, never raised: see `failed`).
    - `stats`: `{"num_steps": ...}`, each query's solver steps, shape
      `(queries,)` (see [`retrax.diffusion.AbstractSolution`][]).
    """

    loss: Float[Array, ""]
    value: PyTree
    z: Float[Array, "queries n"]
    valid: Bool[Array, " queries"]
    failed: Int[Array, ""]
    result: RESULTS
    stats: dict[str, Array]

    grads = deprecated_property("TaskGradient.grads", ".value", lambda s: s.value)


class _EpochConfig(eqx.Module):
    """What one epoch of `fit_through_inference` is compiled for: its static
    options by name (hashed with the epoch's program, so that a later call
    with the same objects reuses it)."""

    loss: Callable = eqx.field(static=True)
    optimizer: optax.GradientTransformation = eqx.field(static=True)
    where: Callable = eqx.field(static=True)
    gradient: str = eqx.field(static=True)
    tol: float | None = eqx.field(static=True)
    max_steps: int = eqx.field(static=True)
    weight: float = eqx.field(static=True)
    batch_size: int = eqx.field(static=True)
    t_range: tuple[float, float] = eqx.field(static=True)


class InferenceHistory(eqx.Module):
    """The record of a [`retrax.relations.fit_through_inference`][] run.

    **Attributes:**

    - `task_loss`: per epoch, the mean task loss over the valid queries
      before that epoch's update, shape `(epochs,)`.
    - `denoising_loss`: per epoch, the minibatch denoising loss (0 without
      `data`), shape `(epochs,)`.
    - `failed`: per epoch, the number of queries masked out of the task loss
      (not converged, not stable, a singular adjoint system or a non-finite
      loss), shape `(epochs,)`.
    - `z_init`: the warm starts at the end, shape `(queries, n)`: each
      query's last valid answer (its first start where it never had one).
      Pass it back as `z_init` to continue.
    """

    task_loss: Float[Array, " epochs"]
    denoising_loss: Float[Array, " epochs"]
    failed: Int[Array, " epochs"]
    z_init: Float[Array, "queries n"]


class InferenceFit(AbstractSolution):
    """A [`retrax.relations.fit_through_inference`][] run.

    Unpacks as the pair `(relation, history)`, the form
    `fit_through_inference` returned before it returned this object.

    **Attributes:**

    - `value`: the trained relation.
    - `history`: the run's [`retrax.relations.InferenceHistory`][].
    - `result`: `successful`; `nonfinite_update` or `nonfinite_loss` for a
      run stopped by an update that would have made the trained arrays or
      the optimiser state non-finite, or by a non-finite denoising loss
      (with `throw=False`; with `throw=True` such a run raises a
      `FloatingPointError` instead).
    - `stats`: `{"num_steps": ...}`, the optimiser steps applied (`epochs`
      unless the run stopped).
    """

    value: AbstractImplicitRelation
    history: InferenceHistory
    result: RESULTS
    stats: dict[str, Array]

    def __iter__(self):
        return iter((self.value, self.history))


def _spec(relation, where):
    """The filter spec of the trained arrays (the inexact arrays of `where(r)`)."""
    nothing = jax.tree.map(lambda _: False, relation)
    inexact = jax.tree.map(eqx.is_inexact_array, relation)
    try:
        return eqx.tree_at(where, nothing, where(inexact))
    except Exception as err:
        raise ValueError(
            "`where` must select parts of the relation, as in `eqx.tree_at` (e.g. "
            f"`lambda r: r.pred`); it raised {type(err).__name__}: {err}"
        ) from err


def _check_queries(relation, z0, rho, z_init):
    if not isinstance(relation, AbstractImplicitRelation):
        raise TypeError(
            "`relation` must be an AbstractImplicitRelation (such as "
            f"ImplicitDiffusion), got {type(relation).__name__}."
        )
    z0 = jnp.asarray(z0)
    if not jnp.issubdtype(z0.dtype, jnp.floating):
        raise TypeError(f"`z0` must have a real floating dtype, got {z0.dtype}.")
    n = relation.dim
    if z0.ndim != 2 or z0.shape[1] != n or z0.shape[0] == 0:
        raise ValueError(
            f"`z0` must have shape (queries, {n}), one query per row of the "
            f"relation's dimension, got shape {z0.shape}."
        )
    rho = jnp.asarray(rho)
    if not jnp.issubdtype(rho.dtype, jnp.floating):
        raise TypeError(f"`rho` must have a real floating dtype, got {rho.dtype}.")
    if rho.shape == (n,):
        rho = jnp.broadcast_to(rho, z0.shape)
    if rho.shape != z0.shape:
        raise ValueError(
            f"`rho` must have shape ({n},) (shared by every query) or the shape "
            f"of `z0` {z0.shape}, got shape {rho.shape}."
        )
    if z_init is None:
        z_init = z0
    z_init = jnp.asarray(z_init)
    if z_init.shape != z0.shape:
        raise ValueError(
            f"`z_init` must have the shape of `z0` {z0.shape}, got {z_init.shape}."
        )
    dtype = z0.dtype
    return z0, rho.astype(dtype), z_init.astype(dtype)


def _task(relation, spec, z0, rho, targets, loss, z_init, gradient, tol, max_steps):
    def solve(z0, rho, z_init):
        return implicit_infer(
            relation, z0, rho, z_init=z_init, tol=tol, max_steps=max_steps, throw=False
        )

    sols = jax.vmap(solve)(z0, rho, z_init)
    z = jax.lax.stop_gradient(sols.value)
    values, zbar = jax.vmap(jax.value_and_grad(loss))(z, targets)
    ok = sols.converged & sols.stable & jnp.isfinite(values)
    ok = ok & jnp.all(jnp.isfinite(zbar), axis=1)
    zbar = jnp.where(ok[:, None], zbar, 0)

    if gradient == "implicit":

        def per_query(sol, z0, rho, zbar):
            pullback = implicit_pullback(relation, sol, z0, rho, zbar, throw=False)
            return pullback.model_bar, pullback.result == RESULTS.successful

        bars, solved = jax.vmap(per_query)(sols, z0, rho, zbar)
        ok = ok & solved
    else:
        # Jacobian-free: the adjoint system J_FF^T mu = -zbar_F with J_FF
        # replaced by the identity (mu = -zbar on the free coordinates).
        def per_query(z, rho, zbar):
            mu = jnp.where(clamp_mask(rho), 0, -zbar)
            _, vjp = eqx.filter_vjp(lambda m: m.prior_field(z), relation)
            (bar,) = vjp(mu)
            return bar

        bars = jax.vmap(per_query)(z, rho, zbar)
    count = jnp.sum(ok)
    scale = 1 / jnp.maximum(count, 1).astype(z.dtype)

    def masked_mean(b):
        mask = ok.reshape(ok.shape + (1,) * (b.ndim - 1))
        return jnp.sum(jnp.where(mask, b, 0), axis=0) * scale.astype(b.dtype)

    # the pullback is linear in zbar: the mean of the per-query cotangents
    grads = jax.tree.map(masked_mean, eqx.filter(bars, spec))
    value = jnp.sum(jnp.where(ok, values, 0)) * scale
    return TaskGradient(
        loss=value,
        value=grads,
        z=z,
        valid=ok,
        failed=ok.shape[0] - count,
        result=sols.result,
        stats={"num_steps": sols.stats["num_steps"]},
    )


def _check_gradient(gradient):
    if gradient not in ("implicit", "jacobian_free"):
        raise ValueError(
            "`gradient` must be 'implicit' (the exact adjoint) or 'jacobian_free', "
            f"got {gradient!r}."
        )


@filter_jit
def task_gradient(
    relation: AbstractImplicitRelation,
    z0: Shaped[ArrayLike, "..."],
    rho: Shaped[ArrayLike, "..."],
    targets: PyTree,
    loss: Callable[[Float[Array, " n"], Any], Float[Array, ""]],
    *,
    where: Callable[[AbstractImplicitRelation], PyTree] = _predictor_of,
    z_init: Shaped[ArrayLike, "..."] | None = None,
    gradient: str = "implicit",
    tol: float | None = None,
    max_steps: int = 200,
    throw: bool = True,
) -> TaskGradient:
    r"""The mean task loss of a set of queries and its gradient.

    Every query $q$ is answered by [`retrax.relations.implicit_infer`][]
    (one `vmap`, `throw=False`); the queries that failed (not converged, not
    stable, a non-finite loss, or a singular adjoint system) are masked out
    and counted, and the task loss is
    $L = \frac{1}{|V|}\sum_{q \in V} \ell(z^*_q, \mathrm{target}_q)$ over the
    valid set $V$. Its gradient with respect to the trained arrays $\theta$
    is, per query, the implicit-function-theorem adjoint
    $\sum_k w_k\lambda_k(\partial\hat\epsilon_k/\partial\theta)^\top\mu_q$ with
    $J_{FF}^\top\mu_q = -\bar z_{q,F}$ (the numbers of
    [`retrax.relations.implicit_pullback`][]), summed over $V$.

    With `gradient="jacobian_free"` the adjoint system is skipped:
    $\mu_q = -\bar z_{q,F}$, as if $J_{FF}$ were the identity (the
    Jacobian-free backpropagation of deep-equilibrium models, Fung et al.,
    "JFB: Jacobian-free backpropagation for implicit networks", AAAI 2022).
    One VJP of the field per query and no Jacobian; not the gradient, and
    not even its scale, but a descent direction when $J_{FF}$ is close
    enough to a positive multiple of the identity. Use it with a
    scale-free optimiser such as Adam.

    **Arguments:**

    - `relation`: the relation.
    - `z0`: the queries, shape `(queries, n)`.
    - `rho`: their stiffnesses, shape `(queries, n)` or `(n,)` for all.
    - `targets`: a pytree whose leaves have a leading axis of length
      `queries`, handed to `loss` one query at a time.
    - `loss`: `loss(z, target) -> scalar`, the task loss of one answer.
    - `where`: selects the trained part of the relation, as in
      `eqx.tree_at` (its floating-point arrays are trained); the predictor
      `relation.pred` by default.
    - `z_init`: the starts, shaped like `z0`; `z0` by default.
    - `gradient`: `"implicit"` (exact) or `"jacobian_free"`.
    - `tol`, `max_steps`: as in `implicit_infer`; `tol` a positive finite
      number (or `None`, a `ValueError` otherwise), `max_steps` a positive
      integer.
    - `throw`: whether a set of queries none of which entered the loss
      raises (eagerly, and at run time under `jit`); with `throw=False` its
      loss and gradient are NaN, and `valid`, `failed` and `result` say why.
      Some failed queries among valid ones never raise: they are masked out
      and counted.

    **Returns:**

    A [`retrax.relations.TaskGradient`][].
    """
    _check_gradient(gradient)
    check_positive_int("max_steps", max_steps)
    tol = check_tol(tol)
    z0, rho, z_init = _check_queries(relation, z0, rho, z_init)
    spec = _spec(relation, where)
    task = _task(
        relation, spec, z0, rho, targets, loss, z_init, gradient, tol, max_steps
    )
    none_valid = task.failed == task.valid.shape[0]
    # a loss over no query is not 0: NaN, or an error
    nan = lambda v: jnp.where(none_valid, jnp.asarray(jnp.nan, v.dtype), v)
    task = eqx.tree_at(
        lambda t: (t.loss, t.value),
        task,
        (nan(task.loss), jax.tree.map(nan, task.value)),
    )
    if throw:
        task = error_if(
            task,
            none_valid,
            "`task_gradient`: no query entered the loss: every one failed (not "
            "converged, not stable, a singular adjoint system or a non-finite "
            "loss). Call it with `throw=False` to read `result` and `valid`.",
        )
    return task


@filter_jit
def _epoch(params, opt_state, static, spec, queries, key, live, config):
    z0, rho, targets, z_init, data = queries
    c = config
    relation = eqx.combine(params, static)
    task = _task(
        relation, spec, z0, rho, targets, c.loss, z_init, c.gradient, c.tol, c.max_steps
    )
    grads = task.value
    if data is None:
        denoising = jnp.zeros((), z0.dtype)
    else:
        k_idx, k_t, k_eps = jax.random.split(key, 3)
        dtype = data.dtype
        x0 = data[jax.random.randint(k_idx, (c.batch_size,), 0, data.shape[0])]
        t = jax.random.uniform(k_t, (c.batch_size,), dtype, *c.t_range)
        eps = jax.random.normal(k_eps, x0.shape, dtype)

        def denoising_loss(p):
            pred = c.where(eqx.combine(p, static))
            return jnp.mean(jax.vmap(pred.denoising_loss)(eps, x0, t))

        denoising, dgrads = jax.value_and_grad(denoising_loss)(params)
        grads = jax.tree.map(
            lambda a, b: a + (c.weight * b).astype(a.dtype), grads, dgrads
        )
        denoising = denoising.astype(z0.dtype)
    # optax mixes Python floats with its int32 step count, which a caller's
    # strict dtype promotion would reject
    with jax.numpy_dtype_promotion("standard"):
        updates, new_opt_state = c.optimizer.update(grads, opt_state, params)
    new_params = eqx.apply_updates(params, updates)
    # a non-finite update is never applied, nor any after a run has stopped
    # (`live` false): `fit_through_inference` raises or reports it
    inexact = [
        x
        for x in jax.tree.leaves(new_opt_state)
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    finite_loss = jnp.isfinite(denoising)
    finite = all_finite(new_params) & all_finite(inexact) & finite_loss
    apply = finite & live
    keep = lambda new, old: jnp.where(apply, new, old)
    params = jax.tree.map(keep, new_params, params)
    opt_state = jax.tree.map(keep, new_opt_state, opt_state)
    z_init = jnp.where(live & task.valid[:, None], task.z, z_init)
    flags = jnp.stack([finite, finite_loss])
    return params, opt_state, z_init, task.loss, denoising, task.failed, flags


def _check_options(
    epochs, batch_size, max_steps, gradient, tol, denoising_weight, t_range
):
    """`fit_through_inference`'s scalar options checked: `(tol, weight, t_range)`."""
    check_positive_int("epochs", epochs)
    check_positive_int("batch_size", batch_size)
    check_positive_int("max_steps", max_steps)
    _check_gradient(gradient)
    tol = check_tol(tol)
    weight = static_float("denoising_weight", denoising_weight)
    if not (math.isfinite(weight) and weight >= 0):
        raise ValueError(
            "`denoising_weight` must be a nonnegative finite weight, got "
            f"{denoising_weight}."
        )
    t0, t1 = check_t_range(t_range)
    return tol, weight, (t0, t1)


def _check_data(relation, where, data, dtype):
    """The denoising data checked against the relation and the predictor
    `where(relation)` it trains, cast to `dtype`."""
    pred = where(relation)
    if not isinstance(pred, AbstractPredictor):
        raise TypeError(
            "with `data`, `where(relation)` must be the noise predictor the "
            f"denoising loss trains, got {type(pred).__name__}."
        )
    data = jnp.asarray(data)
    if data.ndim != 2 or data.shape[0] == 0 or data.shape[1] != relation.dim:
        raise ValueError(
            f"`data` must have shape (num_examples, {relation.dim}), one "
            f"example per row, got shape {data.shape}."
        )
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(f"`data` must have a real floating dtype, got {data.dtype}.")
    if not bool(jnp.all(jnp.isfinite(data))):
        raise ValueError("`data` must be finite (it holds NaN or inf).")
    return data.astype(dtype)


def fit_through_inference(
    relation: AbstractImplicitRelation,
    z0: Shaped[ArrayLike, "..."],
    rho: Shaped[ArrayLike, "..."],
    targets: PyTree,
    loss: Callable[[Float[Array, " n"], Any], Float[Array, ""]],
    key: PRNGKeyArray,
    *,
    epochs: int,
    optimizer: optax.GradientTransformation = _ADAM,
    where: Callable[[AbstractImplicitRelation], PyTree] = _predictor_of,
    data: Shaped[ArrayLike, "..."] | None = None,
    denoising_weight: float = 1.0,
    batch_size: int = 256,
    t_range: tuple[float, float] = (1e-3, 0.2),
    z_init: Shaped[ArrayLike, "..."] | None = None,
    gradient: str = "implicit",
    tol: float | None = None,
    max_steps: int = 200,
    progress: bool = True,
    throw: bool = True,
) -> InferenceFit:
    r"""Train a relation through inference: a task loss on the answers of queries.

    Each epoch answers every query with [`retrax.relations.implicit_infer`][]
    from its warm start, and takes one optimiser step on

    $$L(\theta) = \frac{1}{|V|}\sum_{q\in V}\ell(z^*_q(\theta),
    \mathrm{target}_q) + w\,L_{\mathrm{DSM}}(\theta)$$

    where $V$ is the set of queries whose solve converged to a stable root
    (with a solvable adjoint system and a finite loss): the others are masked
    out and counted in `history.failed`, never silently differentiated. The
    task gradient is the implicit-function-theorem adjoint of
    [`retrax.relations.task_gradient`][] (or its Jacobian-free approximation,
    `gradient="jacobian_free"`). With `data`, $L_{\mathrm{DSM}}$ is the
    denoising loss of the predictor `where(relation)` on a minibatch of
    `batch_size` rows at times $t \sim U(t_0, t_1)$, as in
    [`retrax.diffusion.fit`][], which keeps the field a model of the data
    while the task loss moves its roots. Each query's valid answer becomes
    its next start (a warm start): the answer moves little per step, so
    each solve takes a few Newton steps and stays on its branch. An epoch
    is one jitted program, compiled once (and reused by later calls given
    the same `loss`, `optimizer` and `where` objects and shapes); a tqdm bar
    shows the task loss and the failures.

    **Arguments:**

    - `relation`: the relation to train.
    - `z0`: the queries, shape `(queries, n)`: clamped inputs, soft targets
      and starts, as in `implicit_infer`.
    - `rho`: their stiffnesses, shape `(queries, n)` or `(n,)` for all.
    - `targets`: a pytree whose leaves have a leading axis of length
      `queries`, handed to `loss` one query at a time.
    - `loss`: `loss(z, target) -> scalar`, the task loss of one answer `z`
      (shape `(n,)`).
    - `key`: a PRNG key for the denoising minibatches (epoch $e$ uses
      `jax.random.fold_in(key, e)`).
    - `epochs`: the number of epochs (optimiser steps).
    - `optimizer`: an optax gradient transformation.
    - `where`: selects the trained part of the relation, as in
      `eqx.tree_at`: its floating-point arrays are trained, and with `data`
      it must be the predictor. `relation.pred` by default (the network of
      an [`retrax.relations.ImplicitDiffusion`][]); e.g.
      `lambda r: r.pred.means` trains only a mixture's means.
    - `data`: training data for the denoising loss, shape `(num, n)`, or
      `None` for the task loss alone.
    - `denoising_weight`: the weight $w$ of the denoising loss, finite and
      nonnegative.
    - `batch_size`: denoising examples per epoch.
    - `t_range`: the interval of denoising times.
    - `z_init`: the first starts, shaped like `z0`; `z0` by default.
    - `gradient`: `"implicit"` (the exact adjoint) or `"jacobian_free"`.
    - `tol`, `max_steps`: as in `implicit_infer`; `tol` a positive finite
      number (or `None`), `max_steps` a positive integer.
    - `progress`: show a tqdm progress bar.
    - `throw`: whether a run that stops (a non-finite update or denoising
      loss) raises; with `throw=False` it returns the run up to that epoch
      with its result code.

    **Returns:**

    An [`retrax.relations.InferenceFit`][]: the trained relation (`value`)
    and its [`retrax.relations.InferenceHistory`][] (`history`). It unpacks
    as `trained_relation, history = ...`.

    **Raises:**

    `ValueError` naming the argument for a non-finite or negative
    `denoising_weight`, a `tol` that is not positive and finite, or
    `max_steps < 1` (and for the other bad arguments). An update that would
    make the trained arrays or the optimiser state non-finite, or a
    non-finite denoising loss, is not applied and stops the run at that
    epoch: with `throw=True` (the default) a `FloatingPointError` naming the
    epoch, after that epoch with `progress` (which reads every epoch's
    results anyway), after the last epoch without it (so that the epochs run
    without a pause; none is applied after the first that failed). With
    `throw=False` the run up to that epoch is returned, its `result`
    `RESULTS.nonfinite_update` or `RESULTS.nonfinite_loss` and
    `stats["num_steps"]` the updates applied.
    """
    tol, weight, (t0, t1) = _check_options(
        epochs, batch_size, max_steps, gradient, tol, denoising_weight, t_range
    )
    z0, rho, z_init = _check_queries(relation, z0, rho, z_init)
    num = z0.shape[0]
    for leaf in jax.tree.leaves(targets):
        if jnp.shape(leaf)[:1] != (num,):
            raise ValueError(
                f"every leaf of `targets` must have a leading axis of length {num} "
                f"(one target per query), got shape {jnp.shape(leaf)}."
            )
    spec = _spec(relation, where)
    if data is not None:
        data = _check_data(relation, where, data, z0.dtype)
    params, static = eqx.partition(relation, spec)
    if not jax.tree.leaves(params):
        raise ValueError(
            "`where` selects no floating-point arrays of the relation: nothing "
            "to train."
        )
    config = _EpochConfig(
        loss, optimizer, where, gradient, tol, max_steps, weight, batch_size, (t0, t1)
    )
    queries = (z0, rho, targets, z_init, data)
    params, records, flags = _run_epochs(
        params, static, spec, queries, key, config, epochs, progress, throw
    )
    return _finish(eqx.combine(params, static), records, flags, throw)


def _stop_message(epoch: int) -> str:
    return (
        f"`fit_through_inference` stopped at epoch {epoch} (counting from 0): "
        "its update made the trained parameters or the optimiser state "
        "non-finite, or its denoising loss is not finite (a learning rate or "
        "`denoising_weight` too large?). The update was not applied; with "
        "`throw=False` the run up to that epoch is returned with its result "
        "code."
    )


def _run_epochs(params, static, spec, queries, key, config, epochs, progress, throw):
    """The epochs of `fit_through_inference`, each one jitted program:
    `(params, records, flags)`, the last applied parameters, per epoch
    `(task loss, denoising loss, failures, warm starts)` and per epoch
    `(update finite, denoising loss finite)` as a `(epochs, 2)` array.

    A failed epoch stops the run: with `progress` (which reads every epoch
    anyway) the loop ends there, raising if `throw`; without it the epochs
    run without a pause and apply nothing after the first failure."""
    opt_state = config.optimizer.init(params)
    z0, rho, targets, z_init, data = queries
    records, flags = [], []
    live = jnp.asarray(True)
    with tqdm(total=epochs, disable=not progress, desc="fit", unit="epoch") as bar:
        for epoch in range(epochs):
            batch = (z0, rho, targets, z_init, data)
            params, opt_state, z_init, task, denoising, failed, ok = _epoch(
                params,
                opt_state,
                static,
                spec,
                batch,
                jax.random.fold_in(key, epoch),
                live,
                config,
            )
            records.append((task, denoising, failed, z_init))
            flags.append(ok)
            live = live & ok[0]
            if progress:
                if not bool(ok[0]):
                    if throw:
                        raise FloatingPointError(_stop_message(epoch))
                    break
                bar.update(1)
                bar.set_postfix(loss=f"{float(task):.4g}", failed=int(failed))
    return params, records, np.asarray(jnp.stack(flags))


def _finish(relation, records, flags, throw) -> "InferenceFit":
    """The `InferenceFit` of a run whose epochs left `records` and `flags`
    (see `_run_epochs`): cut at the first failed epoch, if any, which
    raises when `throw`."""
    failed = np.flatnonzero(~flags[:, 0].astype(bool))
    result, steps = RESULTS.successful, len(records)
    if failed.size:
        stop = int(failed[0])
        if throw:
            raise FloatingPointError(_stop_message(stop))
        loss_ok = bool(flags[stop, 1])
        result = RESULTS.nonfinite_update if loss_ok else RESULTS.nonfinite_loss
        # the failed epoch's losses are recorded; its update is not applied
        records, steps = records[: stop + 1], stop
    task, denoising, failures, starts = zip(*records, strict=True)
    history = InferenceHistory(
        task_loss=jnp.stack(task),
        denoising_loss=jnp.stack(denoising),
        failed=jnp.stack(failures),
        z_init=starts[-1],
    )
    return InferenceFit(
        value=relation,
        history=history,
        result=result,
        stats={"num_steps": jnp.asarray(steps)},
    )
