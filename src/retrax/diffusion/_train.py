"""Training a noise predictor by denoising score matching."""

import math
import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped
from tqdm.auto import tqdm

from .._misc import check_positive_int, static_float
from ._predictor import AbstractPredictor


# one module-level default, so that repeated `fit` calls reuse the compiled chunk
_ADAM = optax.adam(1e-3)


def _param_dtype(params) -> jnp.dtype | None:
    for leaf in jax.tree.leaves(params):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.dtype
    return None


@eqx.filter_jit
def _train_chunk(
    params, opt_state, average, static, optimizer, data, key, start, config
):
    chunk, steps, batch_size, t0, t1, ema = config
    num, dtype = data.shape[0], data.dtype

    def loss_fn(p, x0, t, eps):
        pred = eqx.combine(p, static)
        return jnp.mean(jax.vmap(pred.denoising_loss)(eps, x0, t))

    def step(carry, i):
        params, opt_state, average = carry
        k_idx, k_t, k_eps = jax.random.split(jax.random.fold_in(key, i), 3)
        x0 = data[jax.random.randint(k_idx, (batch_size,), 0, num)]
        t = jax.random.uniform(k_t, (batch_size,), dtype, t0, t1)
        eps = jax.random.normal(k_eps, x0.shape, dtype)
        loss, grads = jax.value_and_grad(loss_fn)(params, x0, t, eps)
        # optax's Adam mixes Python floats with its int32 step count, which a
        # caller's strict dtype promotion would reject
        with jax.numpy_dtype_promotion("standard"):
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = eqx.apply_updates(params, updates)
        if ema is None:
            new_average = average
        else:
            new_average = jax.tree.map(
                lambda a, p: ema * a + (1 - ema) * p, average, new_params
            )
        # steps past the end of the run (the tail of the last chunk) are no-ops
        active = i < steps
        keep = lambda new, old: jnp.where(active, new, old)
        params = jax.tree.map(keep, new_params, params)
        opt_state = jax.tree.map(keep, new_opt_state, opt_state)
        average = jax.tree.map(keep, new_average, average)
        return (params, opt_state, average), loss

    idx = start + jnp.arange(chunk, dtype=jnp.int32)
    carry = (params, opt_state, average)
    (params, opt_state, average), losses = jax.lax.scan(step, carry, idx)
    return params, opt_state, average, losses


def fit(
    pred: AbstractPredictor,
    data: Shaped[ArrayLike, "..."],
    key: PRNGKeyArray,
    *,
    optimizer: optax.GradientTransformation = _ADAM,
    steps: int,
    batch_size: int = 256,
    t_range: tuple[float, float] = (1e-3, 0.2),
    progress: bool = True,
    chunk_size: int = 1000,
    ema: float | None = None,
) -> tuple[AbstractPredictor, Float[Array, " steps"]]:
    r"""Train a noise predictor by denoising score matching.

    Every step draws a minibatch of `batch_size` rows of `data` (with
    replacement), times $t \sim U(t_0, t_1)$ and noise $\epsilon \sim N(0, I)$,
    and takes one optimiser step on the mean of
    [`retrax.diffusion.AbstractPredictor.denoising_loss`][]. All floating-point
    arrays of `pred` are trained (for a `NoisePredictor`, the model's weights;
    the schedule's Python floats stay fixed).

    The steps run as one jitted `lax.scan` per chunk of `chunk_size` steps
    (compiled once), and the progress bar advances between chunks.

    The default time range is the small-noise end, the noise levels implicit
    inference reads, not all of `[0, 1]`; use `t_range=(schedule.t_min, 1.0)`
    to train a sampler.

    With a constant step size the last iterate jitters around the minimum at
    about the step size, and the jitter carries into everything read off the
    network (on the circle example, the roots of the implicit field move by
    one or two hundredths over a few tens of steps). `ema` returns instead the
    exponential moving average of the iterates $\theta_1, \dots, \theta_T$,
    $\bar\theta = \frac{1 - d}{1 - d^T}\sum_{s=1}^T d^{T-s}\theta_s$ for the
    decay $d$ (bias-corrected, so the initialisation carries no weight;
    Polyak and Juditsky 1992; the parameter EMA of Ho et al. 2020). Its
    window is about $1/(1 - d)$ steps: a few hundred steps, a small part of
    the run, averages out the jitter without reaching back to a poorly trained
    network. The optimiser itself, and the loss history, are unchanged.

    **Arguments:**

    - `pred`: the predictor to train.
    - `data`: the training set, shape `(num, dim)`, one example per row.
    - `key`: a PRNG key for minibatches, times and noise.
    - `optimizer`: an optax gradient transformation.
    - `steps`: the number of optimiser steps.
    - `batch_size`: examples per step.
    - `t_range`: the interval `(t0, t1)` of training times, inside `[0, 1]`.
    - `progress`: show a tqdm progress bar.
    - `chunk_size`: steps per compiled scan (and per progress-bar update).
    - `ema`: the decay $d \in [0, 1)$ of an exponential moving average of the
      parameters, returned in place of the last iterate (e.g. `0.995`); `None`
      (the default) returns the last iterate.

    **Returns:**

    `(trained_pred, losses)` with the minibatch loss of every step, shape
    `(steps,)`. `trained_pred` holds the last iterate, or the moving average
    with `ema`.
    """
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    check_positive_int("chunk_size", chunk_size)
    if ema is not None:
        if isinstance(ema, bool) or not isinstance(ema, numbers.Real):
            raise TypeError(f"`ema` must be a float decay or None, got {ema!r}.")
        ema = float(ema)
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"`ema` must be a decay in [0, 1), got {ema}.")
    t0, t1 = (static_float("t_range", v) for v in t_range)
    if not 0.0 <= t0 < t1 <= 1.0:
        raise ValueError(
            f"`t_range` must be an interval (t0, t1) with 0 <= t0 < t1 <= 1, "
            f"got {t_range}."
        )
    data = jnp.asarray(data)
    if data.ndim != 2 or data.shape[0] == 0:
        raise ValueError(
            "`data` must have shape (num_examples, dim), one example per row, "
            f"got shape {data.shape}."
        )
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(f"`data` must have a real floating dtype, got {data.dtype}.")
    if not bool(jnp.all(jnp.isfinite(data))):
        bad = int(jnp.sum(~jnp.all(jnp.isfinite(data), axis=1)))
        raise ValueError(
            f"`data` must be finite: {bad} of {data.shape[0]} rows hold NaN or inf."
        )
    params, static = eqx.partition(pred, eqx.is_inexact_array)
    dtype = _param_dtype(params)
    if dtype is not None:
        data = data.astype(dtype)
    try:
        jax.eval_shape(pred.epsilon, data[0], jnp.asarray(t1, data.dtype))
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"the predictor cannot take one row of `data` (shape "
            f"{data.shape[1:]}): {err}"
        ) from err
    opt_state = optimizer.init(params)
    # the moving average starts at zero and is bias-corrected at the end
    average = jax.tree.map(jnp.zeros_like, params) if ema is not None else None
    chunk = min(chunk_size, steps)
    n_chunks = math.ceil(steps / chunk)
    config = (chunk, steps, batch_size, t0, t1, ema)
    history = []
    with tqdm(total=steps, disable=not progress, desc="fit", unit="step") as bar:
        for c in range(n_chunks):
            start = jnp.asarray(c * chunk, jnp.int32)
            params, opt_state, average, losses = _train_chunk(
                params, opt_state, average, static, optimizer, data, key, start, config
            )
            history.append(losses)
            if progress:
                done = min(chunk, steps - c * chunk)
                bar.update(done)
                bar.set_postfix(loss=f"{float(jnp.mean(losses[:done])):.4g}")
    losses = jnp.concatenate(history)[:steps]
    if ema is not None:
        correction = 1.0 / (1.0 - ema**steps)
        params = jax.tree.map(lambda a: (a * correction).astype(a.dtype), average)
    return eqx.combine(params, static), losses
