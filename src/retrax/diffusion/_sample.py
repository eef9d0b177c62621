"""Sampling from a noise predictor: ancestral, reverse SDE, DDIM, conditional;
and `Sample`, the solution every sampler returns."""

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._deprecated import deprecated_property
from .._errors import error_if, filter_jit
from .._solution import AbstractSolution, throw_if_failed
from .._validate import check_positive_int, static_float
from ._predictor import AbstractPredictor
from ._solution import RESULTS
from ._state import as_state_like


class Sample(AbstractSolution):
    """What a sampler returns: one sample, with its result code.

    Returned by [`retrax.diffusion.sample_ancestral`][],
    [`retrax.diffusion.sample_euler_maruyama`][],
    [`retrax.diffusion.sample_ddim`][],
    [`retrax.diffusion.sample_conditional`][],
    [`retrax.diffusion.sample_ode`][],
    [`retrax.diffusion.sample_tweedie_projection`][] and
    [`retrax.diffusion.sample_dps`][]. Batch a sampler with `jax.vmap` over
    keys: every field gains the batch axis (`jax.vmap(...)(keys).value` is
    `(batch, *shape)`).

    **Attributes:**

    - `value`: the sample, of the shape and dtype asked for; NaN when `result`
      is not `successful`.
    - `result`: a [`retrax.diffusion.RESULTS`][] code: `successful`,
      `nonfinite_sample` (the chain's state became NaN or inf) or, for the
      ODE sampler, `ode_failed`.
    - `stats`: `{"num_steps": ...}`, the number of steps the sampler took
      (see [`retrax.diffusion.AbstractSolution`][]).

    With `throw=True` (every sampler's default) a failed sample raises with
    the result's message instead, eagerly and under `jax.jit`.

    `x` is a deprecated alias of `value`.
    """

    value: Float[Array, "*shape"]
    result: RESULTS
    stats: dict[str, Int[Array, ""]]

    x = deprecated_property("Sample.x", ".value", lambda s: s.value)


def finished_sample(
    x: Array, num_steps: Int[ArrayLike, ""], throw: bool, result: RESULTS | None = None
) -> Sample:
    """The `Sample` of a chain's last state `x`: `nonfinite_sample` (and NaN)
    unless every entry is finite, or the failure `result` a solver reported;
    raising by the `throw=` convention."""
    finite = jnp.all(jnp.isfinite(x))
    if result is None:
        result = RESULTS.successful
    result = RESULTS.where(
        finite | (result != RESULTS.successful), result, RESULTS.nonfinite_sample
    )
    ok = result == RESULTS.successful
    x = jnp.where(ok, x, jnp.array(jnp.nan, x.dtype))
    stats = {"num_steps": jnp.asarray(num_steps, jnp.int32)}
    return throw_if_failed(Sample(x, result, stats), throw)


def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(s, int) and s >= 1 for s in shape):
        raise ValueError(f"`shape` must be a tuple of positive integers, got {shape}.")
    return shape


def _t_end(pred: AbstractPredictor, t_end: float | None, name: str = "t_end") -> float:
    t_end = pred.schedule.t_min if t_end is None else static_float(name, t_end)
    if not 0.0 < t_end < 1.0:
        raise ValueError(
            f"`{name}` must lie in (0, 1) (at t = 0 the noise scale is 0 and the "
            f"score is singular), got {t_end}."
        )
    return t_end


def _dtype(dtype: DTypeLike | None) -> jnp.dtype:
    """The sampler's real floating dtype, JAX's default float for `None`."""
    dtype = jnp.dtype(jnp.result_type(float) if dtype is None else dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"`dtype` must be a real floating dtype, got {dtype}.")
    return dtype


def _reverse_scan(pred, key, shape, dtype, steps, t_end, update, clamp):
    """One `lax.scan` from t = 1 down to `t_end` over a uniform time grid.

    `update(x, t, s, key)` returns the state at the earlier time `s`. With a
    clamp `(mask, values)`, clamped coordinates are replaced after every step
    by a fresh draw of the forward process at `s` (the replacement method).
    """
    sched = pred.schedule
    k_init, k_clamp, k_steps = jax.random.split(key, 3)
    x = jax.random.normal(k_init, shape, dtype)
    ts = jnp.linspace(1.0, t_end, steps + 1, dtype=dtype)
    keys = jax.random.split(k_steps, steps)

    def replace(x, s, k):
        mask, values = clamp
        noised = sched.perturb(values, s, jax.random.normal(k, shape, dtype))
        return jnp.where(mask, noised, x)

    if clamp is not None:
        x = replace(x, ts[0], k_clamp)

    def body(x, inp):
        t, s, k = inp
        k_step, k_clamp = jax.random.split(k)
        x = update(x, t, s, k_step)
        if clamp is not None:
            x = replace(x, s, k_clamp)
        return x, None

    x, _ = jax.lax.scan(body, x, (ts[:-1], ts[1:], keys))
    if clamp is not None:
        mask, values = clamp
        x = jnp.where(mask, values, x)
    return x


def _transition(sched, t, s):
    """VP transition from s to t > s: alpha_{t|s} and sigma_{t|s}^2, no cancellation."""
    db = sched.integrated_beta(t) - sched.integrated_beta(s)
    return jnp.exp(-0.5 * db), -jnp.expm1(-db)


def _ancestral_update(pred):
    sched = pred.schedule

    def update(x, t, s, key):
        a_ts, var_ts = _transition(sched, t, s)
        sig_t, sig_s = sched.sigma(t), sched.sigma(s)
        eps = pred.epsilon(x, t)
        mean = (x - (var_ts / sig_t) * eps) / a_ts
        std = jnp.sqrt(var_ts) * sig_s / sig_t
        return mean + std * jax.random.normal(key, x.shape, x.dtype)

    return update


@filter_jit
def sample_ancestral(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    shape: int | tuple[int, ...],
    *,
    steps: int = 500,
    t_end: float | None = None,
    dtype: DTypeLike | None = None,
    throw: bool = True,
) -> Sample:
    r"""Draw one sample by ancestral sampling of the reverse process.

    Starting from $x_1 \sim N(0, I)$, each step on a uniform grid from $t=1$
    to `t_end` draws $x_s \sim q(x_s | x_t, \hat x_0)$, the exact Gaussian
    posterior of the forward process given Tweedie's $\hat x_0$ (DDPM, Ho et
    al. 2020, for a continuous-time VP schedule): mean
    $(x_t - \sigma_{t|s}^2 \hat\epsilon / \sigma_t)/\alpha_{t|s}$ and standard
    deviation $\sigma_{t|s}\sigma_s/\sigma_t$. One `lax.scan`.

    **Arguments:**

    - `pred`: the noise predictor.
    - `key`: a PRNG key; batch with `jax.vmap` over keys.
    - `shape`: the shape of one example.
    - `steps`: the number of reverse steps.
    - `t_end`: the final time, `schedule.t_min` by default. The sample is $x$
      at `t_end` (noised at $\sigma(t_{\mathrm{end}})$, not denoised).
    - `dtype`: JAX's default float by default.
    - `throw`: raise if the sample is not finite; otherwise such a sample is
      NaN with `result` `nonfinite_sample`.

    **Returns:**

    A [`retrax.diffusion.Sample`][]: `x`, one sample of the given shape.
    """
    shape, dtype = _shape(shape), _dtype(dtype)
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    x = _reverse_scan(
        pred, key, shape, dtype, steps, t_end, _ancestral_update(pred), None
    )
    return finished_sample(x, steps, throw)


@filter_jit
def sample_euler_maruyama(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    shape: int | tuple[int, ...],
    *,
    steps: int = 1000,
    t_end: float | None = None,
    dtype: DTypeLike | None = None,
    throw: bool = True,
) -> Sample:
    r"""Draw one sample by Euler–Maruyama on the reverse-time SDE.

    $dx = [f(x,t) - g(t)^2 \nabla\log p_t(x)]\,dt + g(t)\,d\bar w$ from
    $t = 1$ to `t_end` (Song et al., ICLR 2021): with $h = t - s > 0$,
    $x_s = x_t + \beta_t(\tfrac12 x_t - \hat\epsilon/\sigma_t) h +
    \sqrt{\beta_t h}\, z$. One `lax.scan`.

    **Arguments:**

    - `pred`: the noise predictor.
    - `key`: a PRNG key; batch with `jax.vmap` over keys.
    - `shape`: the shape of one example.
    - `steps`: the number of Euler–Maruyama steps.
    - `t_end`: the final time, `schedule.t_min` by default.
    - `dtype`: JAX's default float by default.
    - `throw`: raise if the sample is not finite; otherwise such a sample is
      NaN with `result` `nonfinite_sample`.

    **Returns:**

    A [`retrax.diffusion.Sample`][]: `x`, one sample of the given shape.
    """
    shape, dtype = _shape(shape), _dtype(dtype)
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    sched = pred.schedule

    def update(x, t, s, key):
        # (the grid's times lie in [t_end, 1]: no check staged per step)
        h = t - s
        beta = sched._beta(t)
        drift = beta * (0.5 * x - pred.epsilon(x, t) / sched._sigma(t))
        noise = jnp.sqrt(beta * h) * jax.random.normal(key, x.shape, x.dtype)
        return x + drift * h + noise

    x = _reverse_scan(pred, key, shape, dtype, steps, t_end, update, None)
    return finished_sample(x, steps, throw)


@filter_jit
def sample_ddim(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    shape: int | tuple[int, ...],
    *,
    steps: int = 100,
    eta: float = 0.0,
    t_end: float | None = None,
    dtype: DTypeLike | None = None,
    throw: bool = True,
) -> Sample:
    r"""Draw one sample with DDIM (Song, Meng and Ermon, ICLR 2021).

    $x_s = \alpha_s \hat x_0 + \sqrt{\sigma_s^2 - \eta^2 v}\,\hat\epsilon +
    \eta\sqrt{v}\, z$ with $v = \sigma_{t|s}^2\sigma_s^2/\sigma_t^2$ the
    ancestral variance: deterministic for `eta = 0` (a discretisation of the
    probability-flow ODE), ancestral for `eta = 1`. One `lax.scan`.

    **Arguments:**

    - `pred`: the noise predictor.
    - `key`: a PRNG key (the initial noise, and the step noise if `eta > 0`).
    - `shape`: the shape of one example.
    - `steps`: the number of steps.
    - `eta`: the stochasticity, in `[0, 1]`.
    - `t_end`: the final time, `schedule.t_min` by default.
    - `dtype`: JAX's default float by default.
    - `throw`: raise if the sample is not finite; otherwise such a sample is
      NaN with `result` `nonfinite_sample`.

    **Returns:**

    A [`retrax.diffusion.Sample`][]: `x`, one sample of the given shape.
    """
    shape, dtype = _shape(shape), _dtype(dtype)
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    if not 0.0 <= static_float("eta", eta) <= 1.0:
        raise ValueError(f"`eta` must lie in [0, 1], got {eta}.")
    sched = pred.schedule

    def update(x, t, s, key):
        _, var_ts = _transition(sched, t, s)
        a_t, sig_t = sched.alpha(t), sched.sigma(t)
        a_s, sig_s = sched.alpha(s), sched.sigma(s)
        eps = pred.epsilon(x, t)
        x0 = (x - sig_t * eps) / a_t
        v = eta**2 * var_ts * sig_s**2 / sig_t**2
        out = a_s * x0 + jnp.sqrt(sig_s**2 - v) * eps
        if eta > 0:
            out = out + jnp.sqrt(v) * jax.random.normal(key, x.shape, x.dtype)
        return out

    x = _reverse_scan(pred, key, shape, dtype, steps, t_end, update, None)
    return finished_sample(x, steps, throw)


@filter_jit
def sample_conditional(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    mask: Bool[ArrayLike, "*shape"],
    values: Float[ArrayLike, "*shape"],
    *,
    steps: int = 500,
    t_end: float | None = None,
    throw: bool = True,
) -> Sample:
    r"""Draw one sample with some coordinates clamped (the replacement method).

    Ancestral sampling as in [`retrax.diffusion.sample_ancestral`][], but
    after every step the clamped coordinates are replaced by a fresh draw of
    the forward process at the new time, $\alpha_s v + \sigma_s z$, so that
    the free coordinates are steered by noised versions of the known values
    (Song et al., ICLR 2021, appendix on imputation). The replacement method
    is an approximation to the true conditional, accurate when the clamped
    coordinates determine the mixture component well; see
    `retrax.diffusion` implicit inference for exact conditional roots.

    **Arguments:**

    - `pred`: the noise predictor.
    - `key`: a PRNG key; batch with `jax.vmap` over keys.
    - `mask`: `True` at the clamped coordinates; its shape is the example's.
    - `values`: the clamped values (entries where `mask` is `False` are
      ignored), shaped like `mask`.
    - `steps`: the number of reverse steps.
    - `t_end`: the final time, `schedule.t_min` by default.
    - `throw`: raise if the sample is not finite; otherwise such a sample is
      NaN with `result` `nonfinite_sample`.

    **Returns:**

    A [`retrax.diffusion.Sample`][]: `x`, one sample, equal to `values` where
    `mask` is `True`.
    """
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"`mask` must be a boolean array, got dtype {mask.dtype}.")
    values = as_state_like("values", values, "mask", mask)
    values = error_if(
        values,
        mask & ~jnp.isfinite(values),
        "the clamped `values` must be finite.",
    )
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    values = jnp.where(mask, values, 0.0)
    x = _reverse_scan(
        pred,
        key,
        mask.shape,
        values.dtype,
        steps,
        t_end,
        _ancestral_update(pred),
        (mask, values),
    )
    return finished_sample(x, steps, throw)
